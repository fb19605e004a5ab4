/*
 * ring_attention: exact sequence-parallel ("ring") attention over MPI.
 *
 *   mpirun -n 4 ring_attention [flags]        (see --help, and README.md next to this file)
 *
 * Default: T = 32768 tokens as one sequence, 8 query heads on 2 kv heads (GQA), D = 128,
 * causal sliding window of 4096 tokens, layout zigzag, float32. Every rank builds the same
 * global Q, K, V and dO from one seed, keeps its own rows (ringattn_plan_scatter), and the ranks
 * run the forward and the backward together. Rank 0 prints the configuration, the ring schedule
 * (worked out here from every rank's token map and the SPEC 3 mask; RINGATTN_LOG=info, which
 * this program sets on rank 0 unless you set it, makes the library print its own), the time of
 * each pass (max and min over ranks), GFLOP/s (allowed query-key pairs only), the K/V bytes each
 * rank sent, and the error of a sample of rows per rank (all heads) of O, LSE and dQ against a
 * float64 computation done here. Every rank exits 1 when an error is above the SPEC 9
 * tolerance, 2 on a usage or API error.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, sysconf */
#include <mpi.h>
#include <ringattn.h>
#include <ringattn_mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int64_t seq;     /* total tokens */
    int num_seqs;    /* packed sequences of (nearly) equal length */
    int heads, kv_heads, dim;
    int window;      /* > 0: causal sliding window of W tokens; 0: causal; -1: no mask */
    ringattn_layout_t layout;
    ringattn_dtype_t dtype;
    int threads;     /* per rank; 0 = choose (see threads_per_rank) */
    int sample;      /* rows checked per rank */
    uint64_t seed;
    int backward;
} options_t;

static int rank_, ranks_; /* this process's place in MPI_COMM_WORLD */

/* ---- storage dtypes: float32, float16, bfloat16 (round to nearest even) ---- */

static size_t dtype_size(ringattn_dtype_t dt) { return dt == RINGATTN_FLOAT32 ? 4 : 2; }
static const char *dtype_name(ringattn_dtype_t dt) {
    return dt == RINGATTN_FLOAT32 ? "float32" : dt == RINGATTN_FLOAT16 ? "float16" : "bfloat16";
}
static const char *layout_name(ringattn_layout_t l) {
    return l == RINGATTN_LAYOUT_CONTIGUOUS ? "contiguous"
           : l == RINGATTN_LAYOUT_ZIGZAG   ? "zigzag"
                                           : "striped";
}

static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                    /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* exact scale by 2^24 */
    }
    uint32_t h = ((((ax >> 23) - 112u)) << 10) | ((ax & 0x7fffffu) >> 13);
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);
    } else if (e == 31) {
        f = m ? NAN : INFINITY;
    } else {
        const uint32_t x = ((e + 112u) << 23) | (m << 13);
        memcpy(&f, &x, 4);
    }
    return (h & 0x8000u) ? -f : f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static float load(const void *buf, ringattn_dtype_t dt, int64_t i) {
    if (dt == RINGATTN_FLOAT32) return ((const float *)buf)[i];
    const uint16_t h = ((const uint16_t *)buf)[i];
    return dt == RINGATTN_FLOAT16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static void store(void *buf, ringattn_dtype_t dt, int64_t i, float f) {
    if (dt == RINGATTN_FLOAT32)
        ((float *)buf)[i] = f;
    else
        ((uint16_t *)buf)[i] = dt == RINGATTN_FLOAT16 ? f32_to_f16(f) : f32_to_bf16(f);
}

/* value rounded through the storage dtype, as a same-precision implementation would store it */
static float round_dtype(ringattn_dtype_t dt, float f) {
    if (dt == RINGATTN_FLOAT32) return f;
    return dt == RINGATTN_FLOAT16 ? f16_to_f32(f32_to_f16(f)) : bf16_to_f32(f32_to_bf16(f));
}

/* ---- inputs: the same on every rank (same seed) ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "[rank %d] out of memory (%zu bytes)\n", rank_, bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static void *random_tensor(int64_t elems, ringattn_dtype_t dt, uint64_t *seed) {
    void *p = xmalloc((size_t)elems * dtype_size(dt));
    for (int64_t i = 0; i < elems; ++i) store(p, dt, i, uniform(seed));
    return p;
}

/* the stored values as float32: the buffer itself for float32, a decoded copy otherwise */
static const float *as_float(const void *buf, int64_t elems, ringattn_dtype_t dt) {
    if (dt == RINGATTN_FLOAT32) return buf;
    float *f = xmalloc(sizeof(float) * (size_t)elems);
    for (int64_t i = 0; i < elems; ++i) f[i] = load(buf, dt, i);
    return f;
}

static void release_float(const float *f, const void *buf) {
    if ((const void *)f != buf) free((void *)f);
}

/* ---- masks (SPEC 3; in a ring Q and K are the same tokens, delta = 0) ---- */

typedef struct {
    int64_t lo, hi; /* allowed keys of a row: [lo, hi], global token indices; empty if hi < lo */
} range_t;

static void window_of(const options_t *o, int *wl, int *wr) {
    *wl = o->window > 0 ? o->window - 1 : -1;
    *wr = o->window >= 0 ? 0 : -1; /* causal unless --window -1 */
}

static range_t allowed_keys(const options_t *o, const int32_t *cu, int64_t t) {
    int a = 0, b = o->num_seqs - 1; /* the sequence s with cu[s] <= t < cu[s + 1] */
    while (a < b) {
        const int m = (a + b + 1) / 2;
        if (cu[m] <= t) a = m; else b = m - 1;
    }
    int wl, wr;
    window_of(o, &wl, &wr);
    range_t r = {cu[a], cu[a + 1] - 1};
    if (wl >= 0 && t - wl > r.lo) r.lo = t - wl;
    if (wr >= 0 && t + wr < r.hi) r.hi = t + wr;
    return r;
}

static double allowed_pairs(const options_t *o, const int32_t *cu) {
    double n = 0.0;
    for (int64_t t = 0; t < o->seq; ++t) {
        const range_t r = allowed_keys(o, cu, t);
        if (r.hi >= r.lo) n += (double)(r.hi - r.lo + 1);
    }
    return n;
}

/* ---- the schedule, from every rank's token map ---- */

typedef struct {
    int P, num_steps;  /* ring steps: 1 + the farthest ring distance with an allowed pair */
    int64_t *count;    /* [P] tokens of each rank */
    int32_t **tokens;  /* [P][count] global indices, in local row order */
    int32_t **sorted;  /* [P][count] the same, sorted */
    char *meet;        /* [P * P]: does any query of rank r see any key of rank s */
} ring_map_t;

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* does the sorted key list hold an index in [lo, hi]? */
static int holds_key_in(const int32_t *keys, int64_t n, range_t r) {
    int64_t a = 0, b = n; /* first key >= lo */
    while (a < b) {
        const int64_t m = (a + b) / 2;
        if (keys[m] < r.lo) a = m + 1; else b = m;
    }
    return a < n && keys[a] <= r.hi;
}

/* Gathers every rank's tokens (collective) and works out which shards meet and the ring length. */
static void ring_map_make(ring_map_t *m, ringattn_plan_t plan, const options_t *o,
                          const int32_t *cu) {
    const int P = ranks_;
    int64_t mine = 0;
    ringattn_plan_local_tokens(plan, &mine, NULL);
    int32_t *local = xmalloc(sizeof(int32_t) * (size_t)mine);
    ringattn_plan_local_tokens(plan, &mine, local);
    m->P = P;
    m->count = xmalloc(sizeof(int64_t) * (size_t)P);
    MPI_Allgather(&mine, 1, MPI_INT64_T, m->count, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int *counts = xmalloc(sizeof(int) * (size_t)P), *displs = xmalloc(sizeof(int) * (size_t)P);
    int32_t *all = xmalloc(sizeof(int32_t) * (size_t)o->seq);
    for (int r = 0, at = 0; r < P; at += counts[r++]) counts[r] = (int)m->count[r], displs[r] = at;
    MPI_Allgatherv(local, (int)mine, MPI_INT32_T, all, counts, displs, MPI_INT32_T, MPI_COMM_WORLD);
    m->tokens = xmalloc(sizeof(int32_t *) * (size_t)P);
    m->sorted = xmalloc(sizeof(int32_t *) * (size_t)P);
    for (int r = 0; r < P; ++r) {
        m->tokens[r] = xmalloc(sizeof(int32_t) * (size_t)m->count[r]);
        m->sorted[r] = xmalloc(sizeof(int32_t) * (size_t)m->count[r]);
        memcpy(m->tokens[r], all + displs[r], sizeof(int32_t) * (size_t)m->count[r]);
        memcpy(m->sorted[r], all + displs[r], sizeof(int32_t) * (size_t)m->count[r]);
        qsort(m->sorted[r], (size_t)m->count[r], sizeof(int32_t), cmp_i32);
    }
    m->meet = calloc((size_t)P * P, 1);
    m->num_steps = 1;
    for (int r = 0; r < P; ++r)
        for (int64_t i = 0; i < m->count[r]; ++i) {
            const range_t a = allowed_keys(o, cu, m->tokens[r][i]);
            for (int s = 0; s < P; ++s)
                if (!m->meet[r * P + s] && a.hi >= a.lo && holds_key_in(m->sorted[s], m->count[s], a))
                    m->meet[r * P + s] = 1;
        }
    for (int r = 0; r < P; ++r) /* at step t rank r holds the K/V of rank (r - t) mod P */
        for (int t = 1; t < P; ++t)
            if (m->meet[r * P + (r - t + P) % P] && t + 1 > m->num_steps) m->num_steps = t + 1;
    free(local), free(counts), free(displs), free(all);
}

static void ring_map_free(ring_map_t *m) {
    for (int r = 0; r < m->P; ++r) free(m->tokens[r]), free(m->sorted[r]);
    free(m->tokens), free(m->sorted), free(m->count), free(m->meet);
}

/* Rank 0 prints the schedule: which steps each rank computes at (from the token maps; the
   library's plan info has their count, the ring length and the bytes each rank moves). Every
   rank's info is gathered; a disagreement with the map is reported (it would be a bug). */
static void print_schedule(const ring_map_t *m, ringattn_plan_t plan) {
    const int P = m->P, N = m->num_steps;
    ringattn_plan_info_t mine = RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &mine);
    const double vals[7] = {(double)mine.num_steps, (double)mine.compute_steps,
                            (double)mine.forward_bytes_sent, (double)mine.forward_bytes_received,
                            (double)mine.backward_bytes_sent, (double)mine.backward_bytes_received,
                            (double)mine.local_tokens};
    double *all = xmalloc(sizeof(double) * 7 * (size_t)P);
    MPI_Gather(vals, 7, MPI_DOUBLE, all, 7, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank_ != 0) {
        free(all);
        return;
    }
    printf("schedule (steps from the ranks' token maps and the SPEC 3 mask; bytes from "
           "ringattn_plan_get_info):\n");
    printf("  %d of %d ring steps%s\n", N, P,
           N < P ? " (the ring is cut: no rank needs a farther shard)" : "");
    for (int r = 0; r < P; ++r) {
        const double *v = all + 7 * r;
        char steps[256] = "";
        int kept = 0;
        for (int t = 0; t < N; ++t)
            if (t == 0 || m->meet[r * P + (r - t + P) % P]) {
                const size_t len = strlen(steps);
                snprintf(steps + len, sizeof steps - len, "%s%d", kept++ ? ", " : "", t);
            }
        printf("  rank %d: %lld tokens, computes at step(s) %s; sends %.1f MB forward, "
               "%.1f MB backward (receives %.1f / %.1f MB)\n",
               r, (long long)m->count[r], steps, v[2] * 1e-6, v[4] * 1e-6, v[3] * 1e-6,
               v[5] * 1e-6);
        if ((int)v[0] != N || (int)v[1] != kept || (int64_t)v[6] != m->count[r])
            printf("  warning: the library's plan says %d ring steps, %d computed, %lld tokens on "
                   "rank %d\n", (int)v[0], (int)v[1], (long long)v[6], r);
    }
    free(all);
}

/* ---- reference for one row and head: float64 (oracle) or float32 (plain implementation) ---- */

typedef struct {
    const options_t *opt;
    const float *k, *v; /* global K and V as float32 (exact for every dtype) */
    const int32_t *cu;
} inputs_t;

/* qi, di: the row's query and dO (float32 values of the stored inputs); t: its global index */
#define DEFINE_ROW_REFERENCE(NAME, REAL, EXP, LOG, ROUND)                                     \
    static void NAME(const inputs_t *in, int64_t t, int h, const float *qi, const float *di,   \
                     double *o, double *lse, double *dq) {                                     \
        const options_t *op = in->opt;                                                         \
        const int D = op->dim, hk = h / (op->heads / op->kv_heads);                           \
        const ringattn_dtype_t dt = op->dtype;                                                 \
        const REAL scale = (REAL)(1.0 / sqrt((double)D));                                      \
        const range_t r = allowed_keys(op, in->cu, t);                                         \
        const int64_t nk = r.hi >= r.lo ? r.hi - r.lo + 1 : 0;                                 \
        REAL *s = xmalloc(sizeof(REAL) * (size_t)(nk + 1));                                    \
        REAL *acc = calloc((size_t)D, sizeof(REAL)), *g = calloc((size_t)D, sizeof(REAL));     \
        REAL m = -INFINITY, l = 0;                                                             \
        for (int64_t j = 0; j < nk; ++j) {                                                     \
            const float *kj = in->k + ((r.lo + j) * op->kv_heads + hk) * D;                    \
            REAL d = 0;                                                                        \
            for (int c = 0; c < D; ++c) d += (REAL)qi[c] * (REAL)kj[c];                        \
            s[j] = d * scale;                                                                  \
            if (s[j] > m) m = s[j];                                                            \
        }                                                                                      \
        for (int64_t j = 0; j < nk; ++j) {                                                     \
            const float *vj = in->v + ((r.lo + j) * op->kv_heads + hk) * D;                    \
            s[j] = EXP(s[j] - m);                                                              \
            l += s[j];                                                                         \
            for (int c = 0; c < D; ++c) acc[c] += s[j] * (REAL)vj[c];                          \
        }                                                                                      \
        *lse = nk ? (double)(m + LOG(l)) : -INFINITY;                                          \
        REAL dsum = 0;                                                                         \
        for (int c = 0; c < D; ++c) {                                                          \
            acc[c] = nk ? (REAL)ROUND(dt, acc[c] / l) : 0;                                     \
            o[c] = (double)acc[c];                                                             \
            if (di) dsum += (REAL)di[c] * acc[c];                                              \
        }                                                                                      \
        if (di) { /* SPEC 7, row i alone: dQ_i = scale * sum_j P_ij (dP_ij - D_i) k_j */       \
            for (int64_t j = 0; j < nk; ++j) {                                                 \
                const float *kj = in->k + ((r.lo + j) * op->kv_heads + hk) * D;                \
                const float *vj = in->v + ((r.lo + j) * op->kv_heads + hk) * D;                \
                REAL dp = 0;                                                                   \
                for (int c = 0; c < D; ++c) dp += (REAL)di[c] * (REAL)vj[c];                   \
                const REAL ds = s[j] / l * (dp - dsum);                                        \
                for (int c = 0; c < D; ++c) g[c] += ds * (REAL)kj[c];                          \
            }                                                                                  \
            for (int c = 0; c < D; ++c) dq[c] = (double)ROUND(dt, scale * g[c]);               \
        }                                                                                      \
        free(s), free(acc), free(g);                                                           \
    }

static double keep_double(ringattn_dtype_t dt, double x) { (void)dt; return x; }
DEFINE_ROW_REFERENCE(reference_f64, double, exp, log, keep_double)
DEFINE_ROW_REFERENCE(plain_f32, float, expf, logf, round_dtype)

/* ---- checks on a sample of this rank's rows ---- */

typedef struct { /* maxima, then sums of squares: reduced over ranks with MPI_MAX / MPI_SUM */
    double o_err, o_ref, lse_err, lse_ref;
    double dq_err2, dq_ref2;
} errors_t;

static void accumulate(errors_t *e, const double *o, const double *ro, double lse, double rlse,
                       const double *dq, const double *rdq, int D) {
    for (int c = 0; c < D; ++c) {
        e->o_err = fmax(e->o_err, isfinite(o[c]) ? fabs(o[c] - ro[c]) : INFINITY);
        e->o_ref = fmax(e->o_ref, fabs(ro[c]));
        if (dq) {
            const double d = isfinite(dq[c]) ? dq[c] - rdq[c] : INFINITY;
            e->dq_err2 += d * d;
            e->dq_ref2 += rdq[c] * rdq[c];
        }
    }
    if (!(lse == rlse)) e->lse_err = fmax(e->lse_err, isnan(lse) ? INFINITY : fabs(lse - rlse));
    if (isfinite(rlse)) e->lse_ref = fmax(e->lse_ref, fabs(rlse));
}

static double rel(double err, double ref) { return err == 0.0 ? 0.0 : err / fmax(ref, 1e-30); }

typedef struct {
    const void *q, *dout, *o, *dq; /* local [rows, H, D] tensors, storage dtype */
    const float *lse;              /* local [H, rows] */
    int64_t rows;
    const int32_t *tokens;         /* global index of each local row */
} local_t;

/* The library's rows against float64, and a plain float32 implementation's rows against the
   same float64 reference (the yardstick of SPEC 9 for 16-bit dtypes). */
static void check_rows(const inputs_t *in, const local_t *lc, const int64_t *rows, int nrows,
                       errors_t *lib, errors_t *plain) {
    const options_t *op = in->opt;
    const int D = op->dim, H = op->heads;
    const ringattn_dtype_t dt = op->dtype;
    double *buf = xmalloc(sizeof(double) * (size_t)D * 6);
    double *ro = buf, *rdq = buf + D, *po = buf + 2 * D, *pdq = buf + 3 * D, *lo = buf + 4 * D,
           *ldq = buf + 5 * D;
    float *qi = xmalloc(sizeof(float) * (size_t)D), *di = xmalloc(sizeof(float) * (size_t)D);
    for (int n = 0; n < nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const int64_t row = rows[n], base = (row * H + h) * D;
            for (int c = 0; c < D; ++c) {
                qi[c] = load(lc->q, dt, base + c), di[c] = load(lc->dout, dt, base + c);
                lo[c] = load(lc->o, dt, base + c);
                if (lc->dq) ldq[c] = load(lc->dq, dt, base + c);
            }
            double rlse, plse;
            const float *d = lc->dq ? di : NULL;
            reference_f64(in, lc->tokens[row], h, qi, d, ro, &rlse, rdq);
            plain_f32(in, lc->tokens[row], h, qi, d, po, &plse, pdq);
            accumulate(lib, lo, ro, lc->lse[(int64_t)h * lc->rows + row], rlse,
                       lc->dq ? ldq : NULL, rdq, D);
            accumulate(plain, po, ro, plse, rlse, lc->dq ? pdq : NULL, rdq, D);
        }
    free(buf), free(qi), free(di);
}

static void reduce_errors(errors_t *e) {
    MPI_Allreduce(MPI_IN_PLACE, e, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &e->dq_err2, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

/* SPEC 9: float32 within fixed relative bounds; float16/bfloat16 at most 2x the error of the
   plain same-precision implementation (never below the float32 bound, which LSE, always
   float32, would otherwise have to beat). Every rank reaches the same verdict. */
static int verdict(const char *what, double err, double plain_err, double f32_tol,
                   ringattn_dtype_t dt) {
    const double tol = dt == RINGATTN_FLOAT32 ? f32_tol : fmax(2.0 * plain_err, f32_tol);
    const int ok = err <= tol;
    if (rank_ == 0)
        printf("  %-4s rel error %.3g (plain %s implementation %.3g), tolerance %.3g: %s\n", what,
               err, dtype_name(dt), plain_err, tol, ok ? "ok" : "FAILED");
    return ok;
}

/* ---- options ---- */

static void usage(const char *argv0) {
    printf("usage: mpirun -n P %s [--seq T] [--seqs N] [--heads H] [--kv-heads HKV] [--dim D]\n"
           "          [--window W] [--layout contiguous|zigzag|striped] [--dtype f32|f16|bf16]\n"
           "          [--threads N] [--sample ROWS] [--seed S] [--no-backward]\n"
           "defaults: --seq 32768 --seqs 1 --heads 8 --kv-heads 2 --dim 128 --window 4096\n"
           "          (causal sliding window; 0 = plain causal, -1 = no mask) --layout zigzag\n"
           "          --dtype f32 --threads 0 (OMP_NUM_THREADS if set, else cores / ranks on\n"
           "          the node, at least 1) --sample 16 (rows per rank)\n",
           argv0);
}

static int parse_layout(const char *v, ringattn_layout_t *l) {
    if (!strcmp(v, "contiguous") || !strcmp(v, "contig")) *l = RINGATTN_LAYOUT_CONTIGUOUS;
    else if (!strcmp(v, "zigzag")) *l = RINGATTN_LAYOUT_ZIGZAG;
    else if (!strcmp(v, "striped")) *l = RINGATTN_LAYOUT_STRIPED;
    else return 0;
    return 1;
}

static int parse_dtype(const char *v, ringattn_dtype_t *dt) {
    if (!strcmp(v, "f32") || !strcmp(v, "float32")) *dt = RINGATTN_FLOAT32;
    else if (!strcmp(v, "f16") || !strcmp(v, "float16")) *dt = RINGATTN_FLOAT16;
    else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) *dt = RINGATTN_BFLOAT16;
    else return 0;
    return 1;
}

/* 1 = run, 0 = bad flags, -1 = --help; messages on rank 0 only (every rank parses the same) */
static int parse(int argc, char **argv, options_t *o) {
    *o = (options_t){32768, 1, 8, 2, 128, 4096, RINGATTN_LAYOUT_ZIGZAG, RINGATTN_FLOAT32,
                     0, 16, 1234, 1};
    const int say = rank_ == 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-backward")) { o->backward = 0; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { if (say) usage(argv[0]); return -1; }
        if (!v) { if (say) fprintf(stderr, "%s: missing value or unknown flag\n", a); return 0; }
        ++i;
        if (!strcmp(a, "--seq")) o->seq = atoll(v);
        else if (!strcmp(a, "--seqs")) o->num_seqs = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = atoi(v);
        else if (!strcmp(a, "--dim")) o->dim = atoi(v);
        else if (!strcmp(a, "--window")) o->window = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--sample")) o->sample = atoi(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layout")) {
            if (!parse_layout(v, &o->layout)) {
                if (say) fprintf(stderr, "--layout: got %s, expected contiguous, zigzag or striped\n", v);
                return 0;
            }
        } else if (!strcmp(a, "--dtype")) {
            if (!parse_dtype(v, &o->dtype)) {
                if (say) fprintf(stderr, "--dtype: got %s, expected f32, f16 or bf16\n", v);
                return 0;
            }
        } else { if (say) fprintf(stderr, "unknown flag %s (see --help)\n", a); return 0; }
    }
    if (o->seq < 1 || o->seq > INT32_MAX || o->num_seqs < 1 || o->num_seqs > o->seq ||
        o->heads < 1 || o->kv_heads < 1 || o->heads % o->kv_heads || o->dim < 1 ||
        o->window < -1 || o->sample < 1 || o->threads < 0) {
        if (say) fprintf(stderr, "invalid options (heads must be a multiple of kv-heads; see --help)\n");
        return 0;
    }
    return 1;
}

/* OMP_NUM_THREADS when set; otherwise the node's cores shared among its ranks, at least 1 */
static int threads_per_rank(void) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    MPI_Comm node;
    int local = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > local ? (int)(cores / local) : 1;
}

/* Any rank's failure fails every rank: the ranks agree before going on. */
static int all_ok(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

static int api_ok(const char *fn, ringattn_status_t st) {
    if (st != RINGATTN_SUCCESS)
        fprintf(stderr, "[rank %d] %s: %s: %s\n", rank_, fn, ringattn_status_string(st),
                ringattn_last_error());
    return all_ok(st == RINGATTN_SUCCESS);
}

/* Runs one pass with every rank starting together; *max_s / *min_s over ranks. */
static int timed(ringattn_status_t (*pass)(ringattn_plan_t, const ringattn_tensors_t *, void *),
                 const char *fn, ringattn_plan_t plan, const ringattn_tensors_t *t, double *max_s,
                 double *min_s) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    const ringattn_status_t st = pass(plan, t, NULL);
    const double s = MPI_Wtime() - t0;
    MPI_Allreduce(&s, max_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&s, min_s, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    return api_ok(fn, st);
}

/* ---- main ---- */

typedef struct {
    void *q, *k, *v, *dout, *o, *dq, *dk, *dv; /* this rank's rows */
    float *lse;
} shard_t;

static int run(const options_t *opt, int threads);

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    options_t opt;
    const int parsed = parse(argc, argv, &opt);
    int status = parsed < 0 ? 0 : 2;
    if (parsed > 0) {
        /* The library reads RINGATTN_LOG once, at its first log call: set it before any call. */
        if (rank_ == 0) setenv("RINGATTN_LOG", "info", 0);
        status = run(&opt, opt.threads ? opt.threads : threads_per_rank());
    }
    MPI_Finalize();
    return status;
}

static int run(const options_t *opt, int threads) {
    const int64_t T = opt->seq;
    const int H = opt->heads, HKV = opt->kv_heads, D = opt->dim, P = ranks_;
    const ringattn_dtype_t dt = opt->dtype;
    const size_t es = dtype_size(dt);

    /* num_seqs sequences, the first T % num_seqs one token longer (SPEC 8 convention) */
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(opt->num_seqs + 1));
    cu[0] = 0;
    for (int s = 0; s < opt->num_seqs; ++s)
        cu[s + 1] = cu[s] + (int32_t)(T / opt->num_seqs + (s < T % opt->num_seqs));
    int wl, wr;
    window_of(opt, &wl, &wr);
    if (rank_ == 0) {
        printf("ringattn %s ring attention: %d rank(s) over MPI, backend cpu, %d thread(s) per rank\n",
               ringattn_version_string(), P, threads);
        printf("  tokens %lld in %d sequence(s), heads %d, kv heads %d, head dim %d, %s\n",
               (long long)T, opt->num_seqs, H, HKV, D, dtype_name(dt));
        printf("  mask: %s, window (%d, %d), layout %s\n", wr == 0 ? "causal" : "none", wl, wr,
               layout_name(opt->layout));
        fflush(stdout);
    }

    ringattn_comm_t comm = NULL;
    if (!api_ok("ringattn_comm_create_mpi", ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm))) return 2;
    ringattn_plan_desc_t desc = RINGATTN_PLAN_DESC_INIT;
    desc.num_heads = H;
    desc.num_kv_heads = HKV;
    desc.head_dim = D;
    desc.dtype = dt;
    desc.layout = opt->layout;
    desc.num_seqs = opt->num_seqs;
    desc.cu_seqlens = cu; /* GLOBAL boundaries: the same on every rank */
    desc.causal = wr == 0;
    desc.window_left = wl;
    desc.window_right = -1; /* causal sets it to 0 */
    desc.num_threads = threads;
    ringattn_plan_t plan = NULL;
    if (!api_ok("ringattn_plan_create", ringattn_plan_create(comm, &desc, &plan))) {
        ringattn_comm_destroy(comm);
        return 2;
    }
    ring_map_t map;
    ring_map_make(&map, plan, opt, cu);
    const int64_t rows = map.count[rank_];
    const double pairs = allowed_pairs(opt, cu) * H; /* allowed (query, key) pairs, all heads */
    if (rank_ == 0) {
        printf("  allowed pairs %.4g (%.2f%% of T^2 x heads)\n", pairs,
               100.0 * pairs / ((double)T * (double)T * H));
    }
    print_schedule(&map, plan); /* collective */
    fflush(stdout);

    /* The same global inputs on every rank (one seed); each keeps its own rows. */
    uint64_t seed = opt->seed;
    void *gq = random_tensor(T * H * D, dt, &seed), *gk = random_tensor(T * HKV * D, dt, &seed);
    void *gv = random_tensor(T * HKV * D, dt, &seed), *gdo = random_tensor(T * H * D, dt, &seed);
    shard_t sh;
    sh.q = xmalloc((size_t)(rows * H * D) * es), sh.dout = xmalloc((size_t)(rows * H * D) * es);
    sh.k = xmalloc((size_t)(rows * HKV * D) * es), sh.v = xmalloc((size_t)(rows * HKV * D) * es);
    sh.o = xmalloc((size_t)(rows * H * D) * es), sh.dq = xmalloc((size_t)(rows * H * D) * es);
    sh.dk = xmalloc((size_t)(rows * HKV * D) * es), sh.dv = xmalloc((size_t)(rows * HKV * D) * es);
    sh.lse = xmalloc(sizeof(float) * (size_t)(rows * H));
    const ringattn_tensor_t none = RINGATTN_TENSOR_NONE;
    ringattn_tensor_t g = none, l = none;
    int ok = 1;
    const struct { void *global, *local; int heads; } parts[4] = {
        {gq, sh.q, H}, {gk, sh.k, HKV}, {gv, sh.v, HKV}, {gdo, sh.dout, H}};
    for (int i = 0; i < 4 && ok; ++i) {
        g.data = parts[i].global, l.data = parts[i].local;
        ok = ringattn_plan_scatter(plan, dt, parts[i].heads, D, g, l) == RINGATTN_SUCCESS;
        if (!ok) fprintf(stderr, "[rank %d] ringattn_plan_scatter: %s\n", rank_, ringattn_last_error());
    }
    free(gq), free(gdo); /* the check reads the local Q, dO and the global K, V */

    ringattn_tensors_t ts = RINGATTN_TENSORS_INIT;
    ts.q.data = sh.q, ts.k.data = sh.k, ts.v.data = sh.v, ts.o.data = sh.o, ts.lse = sh.lse;
    ts.dout.data = sh.dout, ts.dq.data = sh.dq, ts.dk.data = sh.dk, ts.dv.data = sh.dv;
    const double fwd_flop = pairs * 4.0 * D, bwd_flop = 2.5 * fwd_flop;
    double fmax_s = 0, fmin_s = 0, bmax_s = 0, bmin_s = 0;
    ok = all_ok(ok) && timed(ringattn_forward, "ringattn_forward", plan, &ts, &fmax_s, &fmin_s);
    if (ok && rank_ == 0)
        printf("forward:  %9.1f ms (slowest rank; fastest %.1f ms)  %7.1f GFLOP/s\n", 1e3 * fmax_s,
               1e3 * fmin_s, fwd_flop / fmax_s * 1e-9);
    if (ok && opt->backward) {
        ok = timed(ringattn_backward, "ringattn_backward", plan, &ts, &bmax_s, &bmin_s);
        if (ok && rank_ == 0)
            printf("backward: %9.1f ms (slowest rank; fastest %.1f ms)  %7.1f GFLOP/s\n",
                   1e3 * bmax_s, 1e3 * bmin_s, bwd_flop / bmax_s * 1e-9);
    }
    int status = 2;
    if (ok) {
        /* sample: this rank's first and last rows and random ones (all heads) */
        const int nrows = opt->sample < rows ? opt->sample : (int)rows;
        int64_t *sample = xmalloc(sizeof(int64_t) * (size_t)(nrows + 1));
        uint64_t pick = opt->seed ^ (0x51ed270b27a4f3c1ull * (uint64_t)(rank_ + 1));
        for (int n = 0; n < nrows; ++n)
            sample[n] = nrows == rows ? n : n == 0 ? 0 : n == 1 ? rows - 1
                                                   : (int64_t)(splitmix(&pick) % (uint64_t)rows);
        const double t0 = MPI_Wtime();
        const float *kf = as_float(gk, T * HKV * D, dt), *vf = as_float(gv, T * HKV * D, dt);
        const inputs_t in = {opt, kf, vf, cu};
        const local_t lc = {sh.q, sh.dout, sh.o, opt->backward ? sh.dq : NULL, sh.lse, rows,
                            map.tokens[rank_]};
        errors_t lib = {0}, plain = {0};
        check_rows(&in, &lc, sample, nrows, &lib, &plain);
        release_float(kf, gk), release_float(vf, gv);
        reduce_errors(&lib), reduce_errors(&plain);
        int checked = nrows;
        MPI_Allreduce(MPI_IN_PLACE, &checked, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank_ == 0)
            printf("check of %d rows (up to %d per rank) x %d heads against float64 (%.1f s):\n",
                   checked, opt->sample, H, MPI_Wtime() - t0);
        int good = verdict("O", rel(lib.o_err, lib.o_ref), rel(plain.o_err, plain.o_ref), 1e-5, dt);
        good &= verdict("LSE", rel(lib.lse_err, lib.lse_ref), rel(plain.lse_err, plain.lse_ref),
                        1e-5, dt);
        if (opt->backward)
            good &= verdict("dQ", rel(sqrt(lib.dq_err2), sqrt(lib.dq_ref2)),
                            rel(sqrt(plain.dq_err2), sqrt(plain.dq_ref2)), 1e-4, dt);
        good = all_ok(good);
        if (rank_ == 0) printf("%s\n", good ? "ok" : "FAILED: error above the SPEC 9 tolerance");
        status = good ? 0 : 1;
        free(sample);
    }
    ring_map_free(&map);
    ringattn_plan_destroy(plan);
    ringattn_comm_destroy(comm); /* before MPI_Finalize */
    free(cu), free(gk), free(gv), free(sh.q), free(sh.k), free(sh.v), free(sh.dout);
    free(sh.o), free(sh.dq), free(sh.dk), free(sh.dv), free(sh.lse);
    return status;
}
