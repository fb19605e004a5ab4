/*
 * dynamic_mask: dynamic mask attention (SPEC 6: a bias per key, and top-k keys per query) over a
 * ring of MPI ranks, with the bias computed from V the way the Doge models do.
 *
 *   mpirun -n 4 dynamic_mask [flags]        (see --help, and README.md next to this file)
 *
 * Default: T = 8192 tokens as one sequence, 8 query heads on 2 kv heads (GQA), D = 64, causal,
 * layout zigzag, float32, keep_k = T / 8. Every rank builds the same global Q, K, V and dO from
 * one seed and keeps its own rows (ringattn_plan_scatter). The key bias has one head per kv
 * head (key_bias_heads = H_kv) and is a function of each token's own V row only:
 *
 *     dt[t, h]   = sum_c V_flat[t, c] * W_dt[c, h]     V_flat[t] = V[t] as [H_kv * D_v]
 *     bias[h, t] = A[h] * softplus(dt[t, h])           A = exp(A_log)
 *
 * with W_dt [H_kv * D_v, H_kv] and A_log [H_kv] random (the weights a trained model would have),
 * so every rank computes the bias of its own rows with no communication. ringattn then keeps, for
 * each query row, the keep_k valid keys of largest bias over the whole sequence (ties: lower
 * position), not per shard. Rank 0 prints the configuration, how many keys a row keeps on
 * average, and the time of each pass (slowest and fastest rank). The check, in float64 code of
 * this file: a sample of each rank's rows (all heads) of O, LSE and dQ, each row's top-k chosen
 * by sorting its valid keys; the sum of dBias over each sequence, which is 0 analytically
 * (sum_j dS_ij = sum_j P_ij (dP_ij - D_i) = D_i - D_i); and a few dBias entries, each the exact
 * column sum over every row of its sequence (given the forward's O and LSE, as the backward
 * is). Every rank exits 1 when an error is above the SPEC 9 tolerance, 2 on a usage or API
 * error. The helpers it shares with the other examples (random inputs, the mask, MPI helpers)
 * are in ../common/example_util.h and ../common/example_mpi.h.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#include <mpi.h>
#include <ringattn.h>
#include <ringattn_mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/example_mpi.h" /* includes example_util.h */

typedef struct {
    int64_t seq;     /* total tokens */
    int num_seqs;    /* packed sequences of (nearly) equal length */
    int heads, kv_heads, dim;
    int keep_k;      /* top-k keys per row; -1 = the longest sequence / 8; 0 = no selection */
    int window;      /* > 0: causal sliding window of W tokens; 0: causal; -1: no mask */
    ringattn_layout_t layout;
    int threads;     /* per rank; 0 = choose (see threads_per_rank) */
    int sample;      /* rows checked per rank */
    int keys;        /* dBias entries (keys) checked as whole column sums */
    int reps;        /* timed runs of each pass; the best is printed */
    uint64_t seed;
    int backward;
    int exp_bias;    /* bias = exp(A * softplus(dt)) instead of A * softplus(dt) */
} options_t;

static int rank_, ranks_; /* this process's place in MPI_COMM_WORLD */

/* ---- inputs: the same on every rank (same seed) ---- */

static float *random_floats(int64_t n, uint64_t *seed) {
    float *p = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) p[i] = (float)uniform(seed);
    return p;
}

/* ---- the key bias, as the Doge models make it from V ---- */

typedef struct {
    int kv_heads, dim;
    double *w_dt; /* [kv_heads * dim, kv_heads], row-major: dt = V_flat @ W_dt */
    double *a;    /* [kv_heads]: A = exp(A_log) */
    int exp_bias;
} doge_t;

/* Random weights from the seed: W_dt uniform with dt[t, h] of unit variance for V uniform in
   [-1, 1) (n inputs of variance 1/3 times weights of variance a^2 / 3: a = 3 / sqrt(n)), and
   A_log uniform in [-1, 1), so A in [0.37, 2.7]. */
static void doge_init(doge_t *g, int kv_heads, int dim, int exp_bias, uint64_t *seed) {
    const int n = kv_heads * dim;
    const double a = 3.0 / sqrt((double)n);
    g->kv_heads = kv_heads, g->dim = dim, g->exp_bias = exp_bias;
    g->w_dt = xmalloc(sizeof(double) * (size_t)n * (size_t)kv_heads);
    g->a = xmalloc(sizeof(double) * (size_t)kv_heads);
    for (int i = 0; i < n * kv_heads; ++i) g->w_dt[i] = a * uniform(seed);
    for (int h = 0; h < kv_heads; ++h) g->a[h] = exp(uniform(seed));
}

static void doge_free(doge_t *g) { free(g->w_dt), free(g->a); }

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* bias [kv_heads, rows] (the layout ringattn takes: head-major, one float per token) from V
   [rows, kv_heads, dim]. Row t's bias depends on V[t] only, so a shard of V gives the bias of
   the same shard, in the same row order. */
static void doge_bias(const doge_t *g, const float *v, int64_t rows, float *bias) {
    const int HKV = g->kv_heads, n = HKV * g->dim;
    for (int64_t t = 0; t < rows; ++t) {
        const float *vt = v + t * n; /* V_flat[t] */
        for (int h = 0; h < HKV; ++h) {
            double dt = 0.0;
            for (int c = 0; c < n; ++c) dt += (double)vt[c] * g->w_dt[(int64_t)c * HKV + h];
            const double b = g->a[h] * softplus(dt);
            bias[h * rows + t] = (float)(g->exp_bias ? exp(b) : b);
        }
    }
}

/* ---- pairs (the SPEC 3 mask: mask_t and allowed_keys in example_util.h) ---- */

/* Over every row of the batch: valid (query, key) pairs and the pairs kept after the top-k
   (min(valid, keep_k) per row: the count does not depend on the bias). */
static void count_pairs(const options_t *o, const mask_t *m, double *valid, double *kept) {
    *valid = *kept = 0.0;
    for (int64_t t = 0; t < o->seq; ++t) {
        const range_t r = allowed_keys(m, t);
        const int64_t n = r.hi >= r.lo ? r.hi - r.lo + 1 : 0;
        *valid += (double)n;
        *kept += (double)(o->keep_k > 0 && n > o->keep_k ? o->keep_k : n);
    }
}

/* ---- SPEC 6 selection, done plainly: sort a row's valid keys ---- */

typedef struct {
    float bias;
    int32_t pos;
} ranked_t;

static int by_rank(const void *a, const void *b) { /* bias descending, then position ascending */
    const ranked_t *x = a, *y = b;
    if (x->bias != y->bias) return x->bias > y->bias ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* The keys row t keeps under bias head hb (global indices, any order); returns how many.
   bias: global [H_b, T]; scratch: T entries. */
static int64_t kept_keys(const options_t *o, const mask_t *m, const float *bias, int hb,
                         int64_t t, ranked_t *scratch, int32_t *out) {
    const range_t r = allowed_keys(m, t);
    const int64_t n = r.hi >= r.lo ? r.hi - r.lo + 1 : 0;
    for (int64_t j = 0; j < n; ++j)
        scratch[j] = (ranked_t){bias[hb * o->seq + r.lo + j], (int32_t)(r.lo + j)};
    int64_t keep = n;
    if (o->keep_k > 0 && n > o->keep_k) {
        qsort(scratch, (size_t)n, sizeof *scratch, by_rank);
        keep = o->keep_k;
    }
    for (int64_t j = 0; j < keep; ++j) out[j] = scratch[j].pos;
    return keep;
}

/* ---- float64 reference for one row and head over its kept keys ---- */

typedef struct {
    const options_t *opt;
    const float *k, *v, *bias; /* global K, V [T, H_kv, D] and key bias [H_b, T] */
    mask_t mask;
} inputs_t;

/* qi, di: the row's query and dO; kept: its nk kept keys. O, LSE and (di != NULL) dQ per SPEC
   2, 4 and 7 in float64. */
static void reference_row(const inputs_t *in, int h, const int32_t *kept, int64_t nk,
                          const float *qi, const float *di, double *s, double *o, double *lse,
                          double *dq) {
    const options_t *op = in->opt;
    const int D = op->dim, H = op->heads, HKV = op->kv_heads;
    const int hk = h / (H / HKV), hb = h / (H / HKV); /* key_bias_heads = H_kv */
    const double scale = 1.0 / sqrt((double)D);
    double m = -INFINITY, l = 0.0, dsum = 0.0;
    for (int64_t j = 0; j < nk; ++j) {
        const float *kj = in->k + ((int64_t)kept[j] * HKV + hk) * D;
        double d = 0.0;
        for (int c = 0; c < D; ++c) d += (double)qi[c] * kj[c];
        s[j] = d * scale + in->bias[hb * op->seq + kept[j]]; /* the bias is not scaled */
        m = fmax(m, s[j]);
    }
    for (int c = 0; c < D; ++c) o[c] = 0.0;
    for (int64_t j = 0; j < nk; ++j) {
        const float *vj = in->v + ((int64_t)kept[j] * HKV + hk) * D;
        s[j] = exp(s[j] - m);
        l += s[j];
        for (int c = 0; c < D; ++c) o[c] += s[j] * vj[c];
    }
    for (int c = 0; c < D; ++c) {
        o[c] = nk ? o[c] / l : 0.0;
        if (di) dsum += (double)di[c] * o[c];
    }
    *lse = nk ? m + log(l) : -INFINITY;
    if (!di) return;
    for (int c = 0; c < D; ++c) dq[c] = 0.0;
    for (int64_t j = 0; j < nk; ++j) { /* dQ_i = scale * sum_j P_ij (dP_ij - D_i) k_j */
        const float *kj = in->k + ((int64_t)kept[j] * HKV + hk) * D;
        const float *vj = in->v + ((int64_t)kept[j] * HKV + hk) * D;
        double dp = 0.0;
        for (int c = 0; c < D; ++c) dp += (double)di[c] * vj[c];
        const double ds = s[j] / l * (dp - dsum);
        for (int c = 0; c < D; ++c) dq[c] += scale * ds * kj[c];
    }
}

/* ---- checks ---- */

typedef struct {
    const float *q, *dout, *o, *dq; /* local [rows, H, D] */
    const float *lse;               /* local [H, rows] */
    const float *dbias;             /* local [H_b, rows] */
    int64_t rows;
    const int32_t *tokens;          /* global index of each local row */
} local_t;

/* Sampled rows of this rank (all heads) against float64: O, LSE and dQ (errors_t and accumulate
   in example_util.h). */
static void check_rows(const inputs_t *in, const local_t *lc, const int64_t *rows, int nrows,
                       errors_t *e) {
    const options_t *op = in->opt;
    const int D = op->dim, H = op->heads, G = H / op->kv_heads;
    ranked_t *scratch = xmalloc(sizeof(ranked_t) * (size_t)op->seq);
    int32_t *kept = xmalloc(sizeof(int32_t) * (size_t)op->seq);
    double *s = xmalloc(sizeof(double) * (size_t)op->seq);
    double *ro = xmalloc(sizeof(double) * (size_t)D), *rdq = xmalloc(sizeof(double) * (size_t)D);
    double *lo = xmalloc(sizeof(double) * (size_t)D), *ldq = xmalloc(sizeof(double) * (size_t)D);
    for (int n = 0; n < nrows; ++n) {
        const int64_t r = rows[n], t = lc->tokens[r];
        for (int hb = 0; hb < op->kv_heads; ++hb) {
            const int64_t nk = kept_keys(op, &in->mask, in->bias, hb, t, scratch, kept);
            for (int h = hb * G; h < (hb + 1) * G; ++h) {
                const int64_t at = (r * H + h) * D;
                double rlse;
                reference_row(in, h, kept, nk, lc->q + at, lc->dq ? lc->dout + at : NULL, s, ro,
                              &rlse, rdq);
                for (int c = 0; c < D; ++c) {
                    lo[c] = lc->o[at + c];
                    if (lc->dq) ldq[c] = lc->dq[at + c];
                }
                accumulate(e, lo, ro, lc->lse[h * lc->rows + r], rlse, lc->dq ? ldq : NULL, rdq, D);
            }
        }
    }
    free(scratch), free(kept), free(s), free(ro), free(rdq), free(lo), free(ldq);
}

/*
 * dBias[hb, j] = sum over rows i and the query heads h of bias head hb of dS_ij (SPEC 7), for
 * each of the nkeys keys: every rank sums over its own rows in float64, from Q, dO and the
 * forward's O and LSE (the backward's inputs), and the rank holding key j adds the library's
 * value. keeps[k * H_b + hb]: rows (times heads) that keep the key; ref, lib: the sums.
 * Collective.
 */
static void check_columns(const inputs_t *in, const local_t *lc, const int64_t *keys, int nkeys,
                          double *ref, double *lib, double *keeps) {
    const options_t *op = in->opt;
    const int D = op->dim, H = op->heads, HKV = op->kv_heads, HB = HKV, G = H / HB;
    const double scale = 1.0 / sqrt((double)D);
    const int n = nkeys * HB;
    int32_t *beat = xmalloc(sizeof(int32_t) * (size_t)(op->seq + 1));
    for (int i = 0; i < n; ++i) ref[i] = lib[i] = keeps[i] = 0.0;
    for (int k = 0; k < nkeys; ++k) {
        const int64_t j = keys[k];
        const int s = seq_of(&in->mask, j);
        const int64_t first = in->mask.cu[s], len = in->mask.cu[s + 1] - first;
        for (int hb = 0; hb < HB; ++hb) {
            /* beat[x]: keys among the first x of the sequence that rank above j (SPEC 6 order),
               so row i keeps j iff fewer than keep_k of its valid keys do */
            const float *b = in->bias + hb * op->seq;
            beat[0] = 0;
            for (int64_t x = 0; x < len; ++x) {
                const int64_t p = first + x;
                beat[x + 1] = beat[x] + (b[p] > b[j] || (b[p] == b[j] && p < j));
            }
            double sum = 0.0, count = 0.0;
            for (int64_t r = 0; r < lc->rows; ++r) {
                const int64_t t = lc->tokens[r];
                if (t < first || t >= first + len) continue;
                const range_t v = allowed_keys(&in->mask, t);
                if (j < v.lo || j > v.hi) continue;
                if (op->keep_k > 0 && v.hi - v.lo + 1 > op->keep_k &&
                    beat[v.hi - first + 1] - beat[v.lo - first] >= op->keep_k)
                    continue;
                for (int h = hb * G; h < (hb + 1) * G; ++h) {
                    const int hk = h / (H / HKV);
                    const float *qi = lc->q + (r * H + h) * D, *di = lc->dout + (r * H + h) * D;
                    const float *oi = lc->o + (r * H + h) * D;
                    const float *kj = in->k + (j * HKV + hk) * D, *vj = in->v + (j * HKV + hk) * D;
                    double z = 0.0, dp = 0.0, dd = 0.0;
                    for (int c = 0; c < D; ++c) {
                        z += (double)qi[c] * kj[c];
                        dp += (double)di[c] * vj[c];
                        dd += (double)di[c] * oi[c];
                    }
                    const double p = exp(z * scale + b[j] - lc->lse[h * lc->rows + r]);
                    sum += p * (dp - dd);
                    count += 1.0;
                }
            }
            ref[k * HB + hb] = sum;
            keeps[k * HB + hb] = count;
            for (int64_t r = 0; r < lc->rows; ++r)
                if (lc->tokens[r] == j) lib[k * HB + hb] = lc->dbias[hb * lc->rows + r];
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, ref, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, lib, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, keeps, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    free(beat);
}

/*
 * sum_j dBias[hb, j] over a sequence is 0 analytically. Over each (bias head, sequence) of L keys
 * this returns the worst |sum_j dBias| / sum_j |dBias| (*abs_ratio, for information) and the
 * worst |sum_j dBias| / (sqrt(L) ||dBias||_2) (*l2_ratio, checked): an error vector e within the
 * SPEC 9 normwise bound (||e|| <= 1e-4 ||dBias||) has |sum_j e_j| <= sqrt(L) ||e||, so a ratio
 * above 1e-4 proves that bound broken. (The first ratio is a stricter, ill-conditioned measure:
 * when a few keys carry most of dBias, the rounding of the other L keys adds up to sqrt(L)
 * times more than their norm.) Collective.
 */
static void dbias_sums(const options_t *op, const mask_t *m, const local_t *lc,
                       double *abs_ratio, double *l2_ratio) {
    const int HB = op->kv_heads, S = op->num_seqs, n = HB * S;
    double *acc = calloc((size_t)(3 * n), sizeof(double)); /* sums, sums of |.|, of squares */
    if (!acc) MPI_Abort(MPI_COMM_WORLD, 2);
    for (int hb = 0; hb < HB; ++hb)
        for (int64_t r = 0; r < lc->rows; ++r) {
            const int s = seq_of(m, lc->tokens[r]);
            const double g = lc->dbias[hb * lc->rows + r];
            acc[hb * S + s] += g;
            acc[n + hb * S + s] += fabs(g);
            acc[2 * n + hb * S + s] += g * g;
        }
    MPI_Allreduce(MPI_IN_PLACE, acc, 3 * n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    *abs_ratio = *l2_ratio = 0.0;
    for (int hb = 0; hb < HB; ++hb)
        for (int s = 0; s < S; ++s) {
            const int i = hb * S + s;
            const double len = m->cu[s + 1] - m->cu[s];
            if (!isfinite(acc[i])) *abs_ratio = *l2_ratio = INFINITY;
            if (!isfinite(acc[i]) || acc[n + i] == 0.0) continue;
            *abs_ratio = fmax(*abs_ratio, fabs(acc[i]) / acc[n + i]);
            *l2_ratio = fmax(*l2_ratio, fabs(acc[i]) / (sqrt(len) * sqrt(acc[2 * n + i])));
        }
    free(acc);
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static int verdict(const char *what, double err, double tol) {
    const int ok = err <= tol;
    if (rank_ == 0) printf("  %-34s %.3g (tolerance %.3g): %s\n", what, err, tol, ok ? "ok" : "FAILED");
    return ok;
}

/* ---- options ---- */

static void usage(const char *argv0) {
    printf("usage: mpirun -n P %s [--seq T] [--seqs N] [--heads H] [--kv-heads HKV] [--dim D]\n"
           "          [--keep-k K] [--window W] [--layout contiguous|zigzag|striped]\n"
           "          [--threads N] [--sample ROWS] [--keys N] [--reps N] [--seed S]\n"
           "          [--exp-bias] [--no-backward]\n"
           "defaults: --seq 8192 --seqs 1 --heads 8 --kv-heads 2 --dim 64 --keep-k L/8 (L the\n"
           "          longest sequence; 0 = bias only, no selection) --window 0 (causal; W > 0 =\n"
           "          causal sliding window of W tokens, -1 = no mask) --layout zigzag\n"
           "          --threads 0 (OMP_NUM_THREADS if set, else cores / ranks on the node, at\n"
           "          least 1) --sample 16 (rows per rank) --keys 4 (dBias columns) --reps 2\n"
           "--exp-bias: bias = exp(A * softplus(dt)) (the other Doge variant) instead of\n"
           "          A * softplus(dt). float32 throughout; key_bias_heads = kv heads.\n",
           argv0);
}

/* 1 = run, 0 = bad flags, -1 = --help; messages on rank 0 only (every rank parses the same) */
static int parse(int argc, char **argv, options_t *o) {
    *o = (options_t){8192, 1, 8, 2, 64, -1, 0, RINGATTN_LAYOUT_ZIGZAG, 0, 16, 4, 2, 1234, 1, 0};
    const int say = rank_ == 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-backward")) { o->backward = 0; continue; }
        if (!strcmp(a, "--exp-bias")) { o->exp_bias = 1; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { if (say) usage(argv[0]); return -1; }
        if (!v) { if (say) fprintf(stderr, "%s: missing value or unknown flag\n", a); return 0; }
        ++i;
        if (!strcmp(a, "--seq")) o->seq = atoll(v);
        else if (!strcmp(a, "--seqs")) o->num_seqs = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = atoi(v);
        else if (!strcmp(a, "--dim")) o->dim = atoi(v);
        else if (!strcmp(a, "--keep-k")) o->keep_k = atoi(v);
        else if (!strcmp(a, "--window")) o->window = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--sample")) o->sample = atoi(v);
        else if (!strcmp(a, "--keys")) o->keys = atoi(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layout")) {
            if (!parse_layout(v, &o->layout)) {
                if (say) fprintf(stderr, "--layout: got %s, expected contiguous, zigzag or striped\n", v);
                return 0;
            }
        } else { if (say) fprintf(stderr, "unknown flag %s (see --help)\n", a); return 0; }
    }
    if (o->seq < 1 || o->seq > INT32_MAX || o->num_seqs < 1 || o->num_seqs > o->seq ||
        o->heads < 1 || o->kv_heads < 1 || o->heads % o->kv_heads || o->dim < 1 || o->dim > 256 ||
        o->keep_k < -1 || o->window < -1 || o->sample < 1 || o->keys < 0 || o->reps < 1 ||
        o->threads < 0) {
        if (say) fprintf(stderr, "invalid options (heads must be a multiple of kv-heads; see --help)\n");
        return 0;
    }
    if (o->keep_k < 0) { /* the longest sequence / 8 */
        const int64_t longest = o->seq / o->num_seqs + (o->seq % o->num_seqs != 0);
        o->keep_k = longest / 8 > 0 ? (int)(longest / 8) : 1;
    }
    return 1;
}

/* ---- main ---- */

static int run(const options_t *opt, int threads);

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    options_t opt;
    const int parsed = parse(argc, argv, &opt);
    int status = parsed < 0 ? 0 : 2;
    if (parsed > 0) status = run(&opt, opt.threads ? opt.threads : threads_per_rank());
    MPI_Finalize();
    return status;
}

static int run(const options_t *opt, int threads) {
    const int64_t T = opt->seq;
    const int H = opt->heads, HKV = opt->kv_heads, D = opt->dim, P = ranks_;
    const int HB = HKV; /* one bias head per kv head, as the Doge models */

    /* num_seqs sequences, the first T % num_seqs one token longer (SPEC 8 convention) */
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(opt->num_seqs + 1));
    split_tokens(T, opt->num_seqs, cu);
    int wl, wr;
    causal_window(opt->window, &wl, &wr);
    const mask_t mask = {cu, opt->num_seqs, wl, wr};
    double valid_pairs, kept_pairs;
    count_pairs(opt, &mask, &valid_pairs, &kept_pairs);
    if (rank_ == 0) {
        printf("ringattn %s dynamic mask attention: %d rank(s) over MPI, backend cpu, %d thread(s) "
               "per rank\n", ringattn_version_string(), P, threads);
        printf("  tokens %lld in %d sequence(s), heads %d, kv heads %d, head dim %d, float32\n",
               (long long)T, opt->num_seqs, H, HKV, D);
        printf("  mask: %s, window (%d, %d), layout %s\n", wr == 0 ? "causal" : "none", wl, wr,
               layout_name(opt->layout));
        printf("  key bias: %d head(s), bias[h, t] = %sA[h] * softplus(V_flat[t] . W_dt[:, h])%s; "
               "keep_k %d%s\n", HB, opt->exp_bias ? "exp(" : "", opt->exp_bias ? ")" : "",
               opt->keep_k, opt->keep_k ? "" : " (no selection)");
        printf("  keys kept per row: %.1f on average of %.1f valid (%.1f%% of the valid pairs)\n",
               kept_pairs / (double)T, valid_pairs / (double)T, 100.0 * kept_pairs / valid_pairs);
        fflush(stdout);
    }

    ringattn_comm_t comm = NULL;
    if (!api_ok("ringattn_comm_create_mpi", ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm))) return 2;
    ringattn_plan_desc_t desc = RINGATTN_PLAN_DESC_INIT;
    desc.num_heads = H;
    desc.num_kv_heads = HKV;
    desc.head_dim = D;
    desc.dtype = RINGATTN_FLOAT32;
    desc.layout = opt->layout;
    desc.num_seqs = opt->num_seqs;
    desc.cu_seqlens = cu; /* GLOBAL boundaries: the same on every rank */
    desc.causal = wr == 0;
    desc.window_left = wl;
    desc.window_right = -1; /* causal sets it to 0 */
    desc.key_bias_heads = HB;
    desc.keep_k = opt->keep_k; /* over each row's whole sequence, not per shard */
    desc.num_threads = threads;
    ringattn_plan_t plan = NULL;
    if (!api_ok("ringattn_plan_create", ringattn_plan_create(comm, &desc, &plan))) {
        ringattn_comm_destroy(comm);
        return 2;
    }
    int64_t rows = 0;
    ringattn_plan_local_tokens(plan, &rows, NULL);
    int32_t *tokens = xmalloc(sizeof(int32_t) * (size_t)rows);
    ringattn_plan_local_tokens(plan, &rows, tokens);

    /* The same global inputs and bias weights on every rank (one seed); each keeps its rows. */
    uint64_t seed = opt->seed;
    float *gq = random_floats(T * H * D, &seed), *gk = random_floats(T * HKV * D, &seed);
    float *gv = random_floats(T * HKV * D, &seed), *gdo = random_floats(T * H * D, &seed);
    doge_t doge;
    doge_init(&doge, HKV, D, opt->exp_bias, &seed);
    float *q = xmalloc(sizeof(float) * (size_t)(rows * H * D));
    float *dout = xmalloc(sizeof(float) * (size_t)(rows * H * D));
    float *k = xmalloc(sizeof(float) * (size_t)(rows * HKV * D));
    float *v = xmalloc(sizeof(float) * (size_t)(rows * HKV * D));
    float *o = xmalloc(sizeof(float) * (size_t)(rows * H * D));
    float *dq = xmalloc(sizeof(float) * (size_t)(rows * H * D));
    float *dk = xmalloc(sizeof(float) * (size_t)(rows * HKV * D));
    float *dv = xmalloc(sizeof(float) * (size_t)(rows * HKV * D));
    float *lse = xmalloc(sizeof(float) * (size_t)(rows * H));
    float *bias = xmalloc(sizeof(float) * (size_t)(rows * HB));  /* [H_b, rows] */
    float *dbias = xmalloc(sizeof(float) * (size_t)(rows * HB)); /* [H_b, rows] */
    const ringattn_dtype_t f32 = RINGATTN_FLOAT32;
    int ok = scatter_rows(plan, f32, H, D, gq, q) && scatter_rows(plan, f32, HKV, D, gk, k) &&
             scatter_rows(plan, f32, HKV, D, gv, v) && scatter_rows(plan, f32, H, D, gdo, dout);
    free(gq), free(gdo); /* the checks read the local Q, dO and the global K, V */
    /* Each rank's bias from its own V rows: [H_b, rows], the local rows of the [H_b, T] bias. */
    doge_bias(&doge, v, rows, bias);

    ringattn_tensors_t ts = RINGATTN_TENSORS_INIT;
    ts.q.data = q, ts.k.data = k, ts.v.data = v, ts.o.data = o, ts.lse = lse;
    ts.dout.data = dout, ts.dq.data = dq, ts.dk.data = dk, ts.dv.data = dv;
    ts.key_bias = bias;
    ts.dbias = dbias;
    double fmax_s = 0, fmin_s = 0, bmax_s = 0, bmin_s = 0;
    ok = all_ok(ok) && timed(ringattn_forward, "ringattn_forward", plan, &ts, opt->reps, NULL,
                             NULL, &fmax_s, &fmin_s);
    if (ok && rank_ == 0)
        printf("forward:  %9.1f ms (slowest rank; fastest %.1f ms; best of %d)\n", 1e3 * fmax_s,
               1e3 * fmin_s, opt->reps);
    if (ok && opt->backward) {
        ok = timed(ringattn_backward, "ringattn_backward", plan, &ts, opt->reps, NULL, NULL, &bmax_s,
                   &bmin_s);
        if (ok && rank_ == 0)
            printf("backward: %9.1f ms (slowest rank; fastest %.1f ms; best of %d)\n",
                   1e3 * bmax_s, 1e3 * bmin_s, opt->reps);
    }
    int status = 2;
    if (ok) {
        const double t0 = MPI_Wtime();
        float *gbias = xmalloc(sizeof(float) * (size_t)(T * HB)); /* [H_b, T], for the checks */
        doge_bias(&doge, gv, T, gbias);
        const inputs_t in = {opt, gk, gv, gbias, mask};
        const local_t lc = {q, dout, o, opt->backward ? dq : NULL, lse, dbias, rows, tokens};

        /* rows: this rank's first and last and random ones */
        const int nrows = opt->sample < rows ? opt->sample : (int)rows;
        int64_t *sample = xmalloc(sizeof(int64_t) * (size_t)(nrows + 1));
        uint64_t pick = opt->seed ^ (0x51ed270b27a4f3c1ull * (uint64_t)(rank_ + 1));
        sample_rows(sample, nrows, rows, &pick);
        errors_t e = {0};
        check_rows(&in, &lc, sample, nrows, &e);
        reduce_errors(&e);
        int checked = nrows;
        MPI_Allreduce(MPI_IN_PLACE, &checked, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        int finite = all_finite(o, rows * H * D) && all_finite(lse, rows * H);
        if (opt->backward)
            finite = finite && all_finite(dq, rows * H * D) && all_finite(dk, rows * HKV * D) &&
                     all_finite(dv, rows * HKV * D) && all_finite(dbias, rows * HB);
        finite = all_ok(finite);

        /* keys, the same on every rank (one seed): the first token, the key of largest bias
           (head 0), then alternately a key that a random row keeps (head 0) and a uniformly
           random key (with a small keep_k most are kept by no row: their dBias must be 0) */
        const int nkeys = opt->keys;
        int64_t *keys = xmalloc(sizeof(int64_t) * (size_t)(nkeys + 1));
        uint64_t kpick = opt->seed ^ 0x9b1c5a3d7e2f4061ull;
        int64_t best = 0;
        for (int64_t t = 1; t < T; ++t)
            if (gbias[t] > gbias[best]) best = t;
        ranked_t *scratch = xmalloc(sizeof(ranked_t) * (size_t)T);
        int32_t *kept = xmalloc(sizeof(int32_t) * (size_t)T);
        for (int n = 0; n < nkeys; ++n) {
            const int64_t t = (int64_t)(splitmix(&kpick) % (uint64_t)T);
            const int64_t nk = n >= 2 && n % 2 == 0 ? kept_keys(opt, &mask, gbias, 0, t, scratch, kept) : 0;
            keys[n] = n == 0 ? 0 : n == 1 ? best : nk ? kept[splitmix(&kpick) % (uint64_t)nk] : t;
        }
        free(scratch), free(kept);
        double *cols = xmalloc(sizeof(double) * (size_t)(3 * nkeys * HB + 1));
        double *ref = cols, *lib = cols + nkeys * HB, *keeps = cols + 2 * nkeys * HB;
        double col_err2 = 0.0, col_ref2 = 0.0, abs_ratio = 0.0, l2_ratio = 0.0;
        if (opt->backward) {
            check_columns(&in, &lc, keys, nkeys, ref, lib, keeps);
            for (int i = 0; i < nkeys * HB; ++i) {
                const double d = isfinite(lib[i]) ? lib[i] - ref[i] : INFINITY;
                col_err2 += d * d, col_ref2 += ref[i] * ref[i];
            }
            dbias_sums(opt, &mask, &lc, &abs_ratio, &l2_ratio);
        }
        if (rank_ == 0) {
            printf("check against float64 (%.1f s): %d rows (up to %d per rank) x %d heads",
                   MPI_Wtime() - t0, checked, opt->sample, H);
            if (opt->backward && nkeys) printf("; dBias of %d keys x %d bias heads", nkeys, HB);
            printf("\n");
            if (opt->backward && nkeys) {
                printf("  %8s %4s %12s %14s %14s\n", "key", "head", "kept by", "dBias", "float64");
                for (int n = 0; n < nkeys; ++n)
                    for (int hb = 0; hb < HB; ++hb) {
                        const int i = n * HB + hb;
                        printf("  %8lld %4d %12.0f %14.6e %14.6e\n", (long long)keys[n], hb,
                               keeps[i], lib[i], ref[i]);
                    }
                printf("  (kept by: rows x query heads that keep the key)\n");
            }
        }
        int good = verdict("outputs finite (0/1)", finite ? 0.0 : 1.0, 0.0);
        good &= verdict("O max rel error", rel(e.o_err, e.o_ref), 1e-5);
        good &= verdict("LSE max rel error", rel(e.lse_err, e.lse_ref), 1e-5);
        if (opt->backward) {
            good &= verdict("dQ rel error (normwise)", rel(sqrt(e.dq_err2), sqrt(e.dq_ref2)), 1e-4);
            if (nkeys)
                good &= verdict("dBias columns rel error", rel(sqrt(col_err2), sqrt(col_ref2)), 1e-4);
            if (rank_ == 0)
                printf("  %-34s %.3g (for information; 0 analytically)\n",
                       "|sum dBias| / sum |dBias|", abs_ratio);
            good &= verdict("|sum dBias| / (sqrt(L) |dBias|_2)", l2_ratio, 1e-4);
        }
        good = all_ok(good);
        if (rank_ == 0) printf("%s\n", good ? "ok" : "FAILED: error above the SPEC 9 tolerance");
        status = good ? 0 : 1;
        free(gbias), free(sample), free(keys), free(cols);
    }
    ringattn_plan_destroy(plan);
    ringattn_comm_destroy(comm); /* before MPI_Finalize */
    doge_free(&doge);
    free(cu), free(tokens), free(gk), free(gv), free(q), free(k), free(v), free(dout), free(o);
    free(dq), free(dk), free(dv), free(lse), free(bias), free(dbias);
    return status;
}
