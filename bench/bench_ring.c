/*
 * bench_ring: ringattn's ring over MPI (CPU backend), three questions.
 *
 *   mpirun -n 2 bench_ring [flags]        (run with --help; bench/README.md explains the output)
 *
 * 1. Parallel efficiency. For causal attention at T = 16384 (8 query heads on 2 kv heads,
 *    D = 128, float32) with each layout, eff = single-rank time / (P x ring time), forward and
 *    backward apart. The single-rank time is measured in the same run on rank 0 (a plan with
 *    comm = NULL and the same threads per rank) while the other ranks sleep.
 * 2. Traffic. The bytes each rank sends and receives per call (ringattn_plan_get_info) against
 *    the lower bound the mask allows: every shard must reach each OTHER rank that has at least
 *    one allowed (query, key) pair with it, worked out here from every rank's token map
 *    (ringattn_plan_local_tokens) and the SPEC 3 mask. Includes a window narrower than a shard
 *    on 4 ranks (over MPI when the job has 4 ranks, else over the threads transport inside
 *    rank 0): steps and bytes only, no times.
 * 3. Overlap. ring time against compute time (the same shards over the threads transport, minus
 *    its in-process copies) and exchange time (the ring's own messages alone, MPI_Isend/Irecv);
 *    hidden = (compute + exchange - ring) / exchange. Also the time the ring spends inside MPI
 *    calls, measured with the MPI profiling interface (PMPI wrappers below).
 *
 * Every ring result is checked on a sample of rows against the single-rank plan's output on
 * rank 0 (O and LSE within 1e-5 relative, dQ, dK, dV within 1e-4 normwise, SPEC 9 float32),
 * and the single-rank output against float64; a wrong result makes every rank exit 1.
 * Output: a '#' banner, the table
 *     seq heads dim mask layout ranks pass time_ms GFLOP/s eff% wrong
 * then the traffic and overlap tables, the tracked figures, and JSON lines.
 */
#define _GNU_SOURCE /* pthread_attr_setaffinity_np; also clock_gettime, nanosleep, sysconf */
#include <mpi.h>
#include <ringattn.h>
#include <ringattn_mpi.h>

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { NUM_LAYOUTS = 3 };
static const char *const layout_names[NUM_LAYOUTS] = {"contig", "zigzag", "striped"};

static int rank_, ranks_;
static int failures;  /* wrong or failed results (rank 0's count is the verdict) */
static FILE *json;    /* rank 0: JSON lines, printed after the tables unless --json FILE */

/* ---------------------------------------------------------------- PMPI: time inside MPI */

/* The library reaches MPI through these three calls (comm/mpi.c). While pmpi_on is set they
   add up the wall time spent inside them: the part of the exchange the ring did not hide. */
static int pmpi_on;
static double pmpi_s, pmpi_max_s; /* total, longest single call */
static long pmpi_calls;

static void pmpi_add(double dt) {
    pmpi_s += dt, ++pmpi_calls;
    if (dt > pmpi_max_s) pmpi_max_s = dt;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req) {
    if (!pmpi_on) return PMPI_Isend(buf, count, type, dest, tag, comm, req);
    const double t0 = PMPI_Wtime();
    const int rc = PMPI_Isend(buf, count, type, dest, tag, comm, req);
    pmpi_add(PMPI_Wtime() - t0);
    return rc;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int src, int tag, MPI_Comm comm,
              MPI_Request *req) {
    if (!pmpi_on) return PMPI_Irecv(buf, count, type, src, tag, comm, req);
    const double t0 = PMPI_Wtime();
    const int rc = PMPI_Irecv(buf, count, type, src, tag, comm, req);
    pmpi_add(PMPI_Wtime() - t0);
    return rc;
}

int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status statuses[]) {
    if (!pmpi_on) return PMPI_Testall(count, reqs, flag, statuses);
    const double t0 = PMPI_Wtime();
    const int rc = PMPI_Testall(count, reqs, flag, statuses);
    pmpi_add(PMPI_Wtime() - t0);
    return rc;
}

/* ---------------------------------------------------------------- utilities */

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_ring: [rank %d] out of memory (%zu bytes)\n", rank_, bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float *random_floats(int64_t n, uint64_t *seed) {
    float *p = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; ++i)
        p[i] = (float)((double)(splitmix(seed) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    return p;
}

static float *zeros(int64_t n) { /* faulted in before any timing */
    float *p = xmalloc(sizeof(float) * (size_t)n);
    memset(p, 0, sizeof(float) * (size_t)n);
    return p;
}

/* A barrier that sleeps: ranks waiting for rank 0's single-rank work leave the cores to it. */
static void idle_barrier(void) {
    MPI_Request r;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    while (!done) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

static int all_ok(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

static int api_ok(const char *fn, ringattn_status_t st) {
    if (st == RINGATTN_SUCCESS) return 1;
    fprintf(stderr, "bench_ring: [rank %d] %s: %s: %s\n", rank_, fn, ringattn_status_string(st),
            ringattn_last_error());
    return 0;
}

/* ---------------------------------------------------------------- problems and masks */

typedef struct {
    int T, H, HKV, D;
    int window; /* > 0: causal sliding window of W tokens; 0: causal; -1: no mask */
} shape_t;

static void mask_name(const shape_t *s, char *buf, size_t n) {
    if (s->window > 0) snprintf(buf, n, "win%d", s->window);
    else snprintf(buf, n, "%s", s->window == 0 ? "causal" : "none");
}

/* allowed keys [lo, hi] of query i (SPEC 3, one sequence, delta = 0) */
static void key_range(const shape_t *s, int64_t i, int64_t *lo, int64_t *hi) {
    *lo = s->window > 0 && i - (s->window - 1) > 0 ? i - (s->window - 1) : 0;
    *hi = s->window >= 0 ? i : s->T - 1;
}

static double allowed_pairs(const shape_t *s) {
    double n = 0.0;
    for (int64_t i = 0; i < s->T; ++i) {
        int64_t lo, hi;
        key_range(s, i, &lo, &hi);
        n += (double)(hi - lo + 1);
    }
    return n;
}

static double flop(const shape_t *s, int bwd) { /* allowed pairs only, FlashAttention's count */
    return allowed_pairs(s) * s->H * 4.0 * s->D * (bwd ? 2.5 : 1.0);
}

typedef struct {
    shape_t s;
    int32_t cu[2];
    float *q, *k, *v, *dout; /* global, the same on every rank (one seed) */
} problem_t;

static void problem_init(problem_t *p, shape_t s, uint64_t seed) {
    const int64_t nq = (int64_t)s.T * s.H * s.D, nk = (int64_t)s.T * s.HKV * s.D;
    p->s = s;
    p->cu[0] = 0, p->cu[1] = s.T;
    p->q = random_floats(nq, &seed);
    p->k = random_floats(nk, &seed);
    p->v = random_floats(nk, &seed);
    p->dout = random_floats(nq, &seed);
}

static void problem_free(problem_t *p) { free(p->q), free(p->k), free(p->v), free(p->dout); }

static ringattn_plan_desc_t make_desc(const problem_t *p, int layout, int threads) {
    ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
    d.num_heads = p->s.H;
    d.num_kv_heads = p->s.HKV;
    d.head_dim = p->s.D;
    d.layout = (ringattn_layout_t)layout;
    d.num_seqs = 1;
    d.cu_seqlens = p->cu;
    d.causal = p->s.window >= 0;
    d.window_left = p->s.window > 0 ? p->s.window - 1 : -1;
    d.num_threads = threads;
    return d;
}

/* ---------------------------------------------------------------- outputs of one run */

typedef struct {
    int64_t rows;
    int32_t *tokens; /* global index of each row */
    float *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
} outputs_t;

static void outputs_alloc(outputs_t *x, const shape_t *s, int64_t rows) {
    const int64_t nq = rows * s->H * s->D, nk = rows * s->HKV * s->D;
    x->rows = rows;
    x->q = zeros(nq), x->dout = zeros(nq), x->o = zeros(nq), x->dq = zeros(nq);
    x->k = zeros(nk), x->v = zeros(nk), x->dk = zeros(nk), x->dv = zeros(nk);
    x->lse = zeros(rows * s->H);
}

static void outputs_free(outputs_t *x) {
    free(x->tokens), free(x->q), free(x->k), free(x->v), free(x->dout), free(x->o);
    free(x->lse), free(x->dq), free(x->dk), free(x->dv);
}

static ringattn_tensors_t tensors_of(const outputs_t *x) {
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = x->q, t.k.data = x->k, t.v.data = x->v, t.o.data = x->o, t.lse = x->lse;
    t.dout.data = x->dout, t.dq.data = x->dq, t.dk.data = x->dk, t.dv.data = x->dv;
    return t;
}

/* This rank's token map and rows of the global inputs, from the plan. */
static int take_rows(ringattn_plan_t plan, const problem_t *p, outputs_t *x) {
    int64_t n = 0;
    if (!api_ok("ringattn_plan_local_tokens", ringattn_plan_local_tokens(plan, &n, NULL))) return 0;
    outputs_alloc(x, &p->s, n);
    x->tokens = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    int ok = api_ok("ringattn_plan_local_tokens", ringattn_plan_local_tokens(plan, &n, x->tokens));
    const ringattn_tensor_t none = RINGATTN_TENSOR_NONE;
    ringattn_tensor_t g = none, l = none;
    const struct { float *global, *local; int heads; } parts[4] = {
        {p->q, x->q, p->s.H}, {p->k, x->k, p->s.HKV}, {p->v, x->v, p->s.HKV}, {p->dout, x->dout, p->s.H}};
    for (int i = 0; i < 4 && ok; ++i) {
        g.data = parts[i].global, l.data = parts[i].local;
        ok = api_ok("ringattn_plan_scatter",
                    ringattn_plan_scatter(plan, RINGATTN_FLOAT32, parts[i].heads, p->s.D, g, l));
    }
    return ok;
}

/* ---------------------------------------------------------------- the single-rank reference */

typedef struct {
    int nrows;
    int32_t *rows; /* sampled global rows: first, last, random */
} sample_t;

static void sample_init(sample_t *smp, int T, int n, uint64_t seed) {
    smp->nrows = n < T ? n : T;
    smp->rows = xmalloc(sizeof(int32_t) * (size_t)smp->nrows);
    for (int i = 0; i < smp->nrows; ++i)
        smp->rows[i] = smp->nrows == T ? i : i == 0 ? 0 : i == 1 ? T - 1
                                                  : (int32_t)(splitmix(&seed) % (uint64_t)T);
}

typedef struct {
    outputs_t out; /* global outputs (rank 0) */
    double fwd_s, bwd_s;
    double err_fwd, err_bwd; /* against float64 on the sample */
    int ok;
} single_t;

/* float64 O, LSE, dQ of row i, head h (SPEC 2-7 for one row) */
static void reference_row(const problem_t *p, int64_t i, int h, double *o, double *lse, double *dq) {
    const shape_t *s = &p->s;
    const int D = s->D, hk = h / (s->H / s->HKV);
    const double scale = 1.0 / sqrt((double)D);
    int64_t lo, hi;
    key_range(s, i, &lo, &hi);
    const float *qi = p->q + (i * s->H + h) * D, *di = p->dout + (i * s->H + h) * D;
    double *w = xmalloc(sizeof(double) * (size_t)(hi - lo + 1)), m = -INFINITY, l = 0.0, dsum = 0.0;
    double *g = calloc((size_t)D, sizeof(double));
    for (int c = 0; c < D; ++c) o[c] = 0.0;
    for (int64_t j = lo; j <= hi; ++j) {
        const float *kj = p->k + (j * s->HKV + hk) * D;
        double d = 0.0;
        for (int c = 0; c < D; ++c) d += (double)qi[c] * kj[c];
        w[j - lo] = d * scale, m = fmax(m, w[j - lo]);
    }
    for (int64_t j = lo; j <= hi; ++j) {
        const float *vj = p->v + (j * s->HKV + hk) * D;
        w[j - lo] = exp(w[j - lo] - m), l += w[j - lo];
        for (int c = 0; c < D; ++c) o[c] += w[j - lo] * vj[c];
    }
    for (int c = 0; c < D; ++c) o[c] /= l, dsum += di[c] * o[c];
    *lse = m + log(l);
    for (int64_t j = lo; j <= hi; ++j) {
        const float *kj = p->k + (j * s->HKV + hk) * D, *vj = p->v + (j * s->HKV + hk) * D;
        double dp = 0.0;
        for (int c = 0; c < D; ++c) dp += (double)di[c] * vj[c];
        const double ds = w[j - lo] / l * (dp - dsum);
        for (int c = 0; c < D; ++c) g[c] += ds * kj[c];
    }
    for (int c = 0; c < D; ++c) dq[c] = scale * g[c];
    free(w), free(g);
}

static void check_single(const problem_t *p, const sample_t *smp, single_t *r) {
    const int H = p->s.H, D = p->s.D;
    double *o = xmalloc(sizeof(double) * (size_t)D), *dq = xmalloc(sizeof(double) * (size_t)D), lse;
    double eo = 0, ro = 0, el = 0, rl = 0, eq = 0, rq = 0;
    for (int n = 0; n < smp->nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const int64_t i = smp->rows[n], at = (i * H + h) * D;
            reference_row(p, i, h, o, &lse, dq);
            for (int c = 0; c < D; ++c) {
                eo = fmax(eo, isfinite(r->out.o[at + c]) ? fabs(r->out.o[at + c] - o[c]) : INFINITY);
                ro = fmax(ro, fabs(o[c]));
                const double d = isfinite(r->out.dq[at + c]) ? r->out.dq[at + c] - dq[c] : INFINITY;
                eq += d * d, rq += dq[c] * dq[c];
            }
            const float l = r->out.lse[(int64_t)h * p->s.T + i];
            el = fmax(el, isfinite(l) ? fabs(l - lse) : INFINITY), rl = fmax(rl, fabs(lse));
        }
    r->err_fwd = fmax(eo / fmax(ro, 1e-30), el / fmax(rl, 1e-30));
    r->err_bwd = sqrt(eq) / fmax(sqrt(rq), 1e-30);
    free(o), free(dq);
}

/* Rank 0 runs the single-rank plan while the other ranks sleep; best of reps. */
static void run_single(const problem_t *p, int threads, int reps, const sample_t *smp, single_t *r) {
    memset(r, 0, sizeof *r);
    if (rank_ == 0) {
        const ringattn_plan_desc_t d = make_desc(p, 0, threads);
        ringattn_plan_t plan = NULL;
        r->ok = api_ok("ringattn_plan_create", ringattn_plan_create(NULL, &d, &plan));
        if (r->ok) r->ok = take_rows(plan, p, &r->out);
        const ringattn_tensors_t t = tensors_of(&r->out);
        r->fwd_s = r->bwd_s = INFINITY;
        for (int rep = 0; rep < reps && r->ok; ++rep) {
            double t0 = now();
            r->ok = api_ok("ringattn_forward", ringattn_forward(plan, &t, NULL));
            r->fwd_s = fmin(r->fwd_s, now() - t0);
            t0 = now();
            r->ok = r->ok && api_ok("ringattn_backward", ringattn_backward(plan, &t, NULL));
            r->bwd_s = fmin(r->bwd_s, now() - t0);
        }
        ringattn_plan_destroy(plan);
        if (r->ok) check_single(p, smp, r);
    }
    idle_barrier();
}

/* ---------------------------------------------------------------- token maps -> mask needs */

typedef struct {
    int P, N;          /* ranks; ring steps the mask needs (1 + the longest journey) */
    int64_t *count;    /* [P] tokens per rank */
    int32_t **tokens;  /* [P][count] global indices in local row order */
    char *meet;        /* [P * P] rank r's queries have an allowed pair with shard s */
    int *last_hop;     /* [P] how far shard s must travel along the ring */
    int *needers;      /* [P] OTHER ranks with an allowed pair with shard s */
} ring_map_t;

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int holds_key_in(const int32_t *keys, int64_t n, int64_t lo, int64_t hi) {
    int64_t a = 0, b = n; /* first key >= lo */
    while (a < b) {
        const int64_t m = (a + b) / 2;
        if (keys[m] < lo) a = m + 1; else b = m;
    }
    return a < n && keys[a] <= hi;
}

/* counts and tokens: [P] arrays, taken over by the map */
static void map_build(ring_map_t *m, const shape_t *s, int P, int64_t *count, int32_t **tokens) {
    m->P = P, m->count = count, m->tokens = tokens;
    m->meet = calloc((size_t)P * P, 1);
    m->last_hop = calloc((size_t)P, sizeof(int));
    m->needers = calloc((size_t)P, sizeof(int));
    int32_t **sorted = xmalloc(sizeof(int32_t *) * (size_t)P);
    for (int r = 0; r < P; ++r) {
        sorted[r] = xmalloc(sizeof(int32_t) * (size_t)(count[r] + 1));
        memcpy(sorted[r], tokens[r], sizeof(int32_t) * (size_t)count[r]);
        qsort(sorted[r], (size_t)count[r], sizeof(int32_t), cmp_i32);
    }
    for (int r = 0; r < P; ++r)
        for (int64_t i = 0; i < count[r]; ++i) {
            int64_t lo, hi;
            key_range(s, tokens[r][i], &lo, &hi);
            for (int t = 0; t < P; ++t)
                if (!m->meet[r * P + t] && holds_key_in(sorted[t], count[t], lo, hi)) m->meet[r * P + t] = 1;
        }
    m->N = 1;
    for (int sh = 0; sh < P; ++sh) {
        for (int j = 1; j < P; ++j) /* rank sh + j holds shard sh at step j */
            if (m->meet[((sh + j) % P) * P + sh]) m->last_hop[sh] = j, ++m->needers[sh];
        if (m->last_hop[sh] + 1 > m->N) m->N = m->last_hop[sh] + 1;
    }
    for (int r = 0; r < P; ++r) free(sorted[r]);
    free(sorted);
}

static void map_free(ring_map_t *m) {
    for (int r = 0; r < m->P; ++r) free(m->tokens[r]);
    free(m->tokens), free(m->count), free(m->meet), free(m->last_hop), free(m->needers);
}

static double kv_bytes(const shape_t *s, const ring_map_t *m, int sh) { /* float32 K and V */
    return (double)m->count[sh] * s->HKV * 2.0 * s->D * sizeof(float);
}

/* Lower bounds per call: shard s reaches needers(s) other ranks (its K/V; in the backward also
   one float32 dK/dV message per needer, to the owner or on to the next needer). Per rank:
   the K/V it must receive. */
static void lower_bound(const shape_t *s, const ring_map_t *m, double *fwd_total,
                        double *bwd_total, double *need) {
    *fwd_total = *bwd_total = 0.0;
    for (int sh = 0; sh < m->P; ++sh) {
        *fwd_total += kv_bytes(s, m, sh) * m->needers[sh];
        *bwd_total += 2.0 * kv_bytes(s, m, sh) * m->needers[sh]; /* float32: dK/dV as big as K/V */
    }
    for (int r = 0; r < m->P; ++r) {
        need[r] = 0.0;
        for (int sh = 0; sh < m->P; ++sh)
            if (sh != r && m->meet[r * m->P + sh]) need[r] += kv_bytes(s, m, sh);
    }
}

/* ---------------------------------------------------------------- comparing ring rows */

typedef struct { /* maxima (O, LSE) and sums of squares (dQ, dK, dV) */
    double o_e, o_r, l_e, l_r, q_e, q_r, k_e, k_r, v_e, v_r;
} errs_t;

static int rec_floats(const shape_t *s) { return 1 + 2 * s->H * s->D + s->H + 2 * s->HKV * s->D; }

/* Packs the sampled rows this rank holds: [global index, O, LSE per head, dQ, dK, dV]. */
static int pack_records(const shape_t *s, const sample_t *smp, const outputs_t *x, float *buf) {
    const int H = s->H, HK = s->HKV, D = s->D;
    int32_t *local = xmalloc(sizeof(int32_t) * (size_t)s->T);
    for (int i = 0; i < s->T; ++i) local[i] = -1;
    for (int64_t i = 0; i < x->rows; ++i) local[x->tokens[i]] = (int32_t)i;
    int n = 0;
    for (int k = 0; k < smp->nrows; ++k) {
        const int64_t i = local[smp->rows[k]];
        if (i < 0) continue;
        float *r = buf + (size_t)n++ * rec_floats(s);
        *r++ = (float)smp->rows[k];
        memcpy(r, x->o + i * H * D, sizeof(float) * (size_t)(H * D)), r += H * D;
        for (int h = 0; h < H; ++h) *r++ = x->lse[(int64_t)h * x->rows + i];
        memcpy(r, x->dq + i * H * D, sizeof(float) * (size_t)(H * D)), r += H * D;
        memcpy(r, x->dk + i * HK * D, sizeof(float) * (size_t)(HK * D)), r += HK * D;
        memcpy(r, x->dv + i * HK * D, sizeof(float) * (size_t)(HK * D));
    }
    free(local);
    return n;
}

static void diff(const float *a, const float *ref, int n, double *e, double *r, int squares) {
    for (int c = 0; c < n; ++c) {
        const double d = isfinite(a[c]) ? fabs((double)a[c] - ref[c]) : INFINITY;
        if (squares) *e += d * d, *r += (double)ref[c] * ref[c];
        else *e = fmax(*e, d), *r = fmax(*r, fabs(ref[c]));
    }
}

static void compare_records(const shape_t *s, const float *recs, int n, const outputs_t *ref,
                            errs_t *e) {
    const int H = s->H, HK = s->HKV, D = s->D;
    for (int k = 0; k < n; ++k) {
        const float *r = recs + (size_t)k * rec_floats(s);
        const int64_t i = (int64_t)r[0];
        r += 1;
        diff(r, ref->o + i * H * D, H * D, &e->o_e, &e->o_r, 0), r += H * D;
        for (int h = 0; h < H; ++h, ++r) diff(r, ref->lse + (int64_t)h * s->T + i, 1, &e->l_e, &e->l_r, 0);
        diff(r, ref->dq + i * H * D, H * D, &e->q_e, &e->q_r, 1), r += H * D;
        diff(r, ref->dk + i * HK * D, HK * D, &e->k_e, &e->k_r, 1), r += HK * D;
        diff(r, ref->dv + i * HK * D, HK * D, &e->v_e, &e->v_r, 1);
    }
}

static double rel(double e, double r) { return e == 0.0 ? 0.0 : e / fmax(r, 1e-30); }
static double err_fwd(const errs_t *e) { return fmax(rel(e->o_e, e->o_r), rel(e->l_e, e->l_r)); }
static double err_bwd(const errs_t *e) {
    return fmax(rel(sqrt(e->q_e), sqrt(e->q_r)),
                fmax(rel(sqrt(e->k_e), sqrt(e->k_r)), rel(sqrt(e->v_e), sqrt(e->v_r))));
}

/* ---------------------------------------------------------------- one ring configuration */

typedef struct {
    int layout, P, timed, threads_transport;
    ring_map_t map;
    ringattn_plan_info_t *info;   /* [P] the library's own schedule and traffic */
    double fwd_s, bwd_s;          /* slowest rank (best of reps) */
    double mpi_fwd_s, mpi_bwd_s;  /* MPI rings: time inside MPI calls, slowest rank */
    double mpi_max_s[2];          /* the longest single MPI call, fwd / bwd, any rank */
    long mpi_calls[2];            /* MPI calls of the slowest rank, fwd / bwd */
    double copy_fwd_s, copy_bwd_s; /* threads rings: time of the in-process copies, slowest rank */
    double err_fwd, err_bwd;
    int ok;
} ring_t;

static void ring_free(ring_t *r) {
    if (r->map.P) map_free(&r->map);
    free(r->info);
    r->info = NULL;
}

/* Gathers every rank's token map to build the map (all ranks), and the infos (rank 0). */
static void gather_maps(const shape_t *s, const outputs_t *x, ringattn_plan_t plan, ring_t *r) {
    const int P = ranks_;
    int64_t *count = xmalloc(sizeof(int64_t) * (size_t)P);
    MPI_Allgather(&x->rows, 1, MPI_INT64_T, count, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int *cnt = xmalloc(sizeof(int) * (size_t)P), *dsp = xmalloc(sizeof(int) * (size_t)P);
    for (int i = 0, at = 0; i < P; at += cnt[i++]) cnt[i] = (int)count[i], dsp[i] = at;
    int32_t *all = xmalloc(sizeof(int32_t) * (size_t)s->T);
    MPI_Allgatherv(x->tokens, (int)x->rows, MPI_INT32_T, all, cnt, dsp, MPI_INT32_T, MPI_COMM_WORLD);
    int32_t **tokens = xmalloc(sizeof(int32_t *) * (size_t)P);
    for (int i = 0; i < P; ++i) {
        tokens[i] = xmalloc(sizeof(int32_t) * (size_t)(count[i] + 1));
        memcpy(tokens[i], all + dsp[i], sizeof(int32_t) * (size_t)count[i]);
    }
    map_build(&r->map, s, P, count, tokens);
    ringattn_plan_info_t mine = RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &mine);
    r->info = xmalloc(sizeof mine * (size_t)P);
    MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, r->info, (int)sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
    free(cnt), free(dsp), free(all);
}

/* One pass on every rank after a barrier; best of reps per rank, then the slowest rank. */
static int timed_pass(ringattn_plan_t plan, const ringattn_tensors_t *t, int bwd, int reps,
                      ring_t *r) {
    double best = INFINITY, best_mpi = 0.0, best_max = 0.0;
    long best_calls = 0;
    int ok = 1;
    for (int rep = 0; rep < reps && ok; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        pmpi_s = pmpi_max_s = 0.0, pmpi_calls = 0, pmpi_on = 1;
        const double t0 = MPI_Wtime();
        const ringattn_status_t st = bwd ? ringattn_backward(plan, t, NULL) : ringattn_forward(plan, t, NULL);
        const double dt = MPI_Wtime() - t0;
        pmpi_on = 0;
        ok = all_ok(api_ok(bwd ? "ringattn_backward" : "ringattn_forward", st));
        if (dt < best) best = dt, best_mpi = pmpi_s, best_max = pmpi_max_s, best_calls = pmpi_calls;
    }
    struct { double v; int r; } mine = {best, rank_}, slowest;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    MPI_Allreduce(&best_mpi, bwd ? &r->mpi_bwd_s : &r->mpi_fwd_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &best_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Bcast(&best_calls, 1, MPI_LONG, slowest.r, MPI_COMM_WORLD);
    *(bwd ? &r->bwd_s : &r->fwd_s) = slowest.v;
    r->mpi_max_s[bwd] = best_max, r->mpi_calls[bwd] = best_calls;
    return ok;
}

/* Sampled rows of every rank to rank 0, compared there with the single-rank outputs. */
static void check_ring_mpi(const shape_t *s, const sample_t *smp, const outputs_t *x,
                           const single_t *ref, ring_t *r) {
    const int rf = rec_floats(s);
    float *mine = xmalloc(sizeof(float) * (size_t)smp->nrows * rf);
    const int n = pack_records(s, smp, x, mine) * rf;
    int *cnt = xmalloc(sizeof(int) * (size_t)ranks_), *dsp = xmalloc(sizeof(int) * (size_t)ranks_);
    MPI_Gather(&n, 1, MPI_INT, cnt, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int total = 0;
    for (int i = 0; rank_ == 0 && i < ranks_; ++i) dsp[i] = total, total += cnt[i];
    float *all = xmalloc(sizeof(float) * (size_t)(total + 1));
    MPI_Gatherv(mine, n, MPI_FLOAT, all, cnt, dsp, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (rank_ == 0) {
        errs_t e = {0};
        compare_records(s, all, total / rf, &ref->out, &e);
        r->err_fwd = total / rf == smp->nrows ? err_fwd(&e) : INFINITY; /* every row once */
        r->err_bwd = total / rf == smp->nrows ? err_bwd(&e) : INFINITY;
    }
    free(mine), free(cnt), free(dsp), free(all);
}

static void run_ring_mpi(ringattn_comm_t comm, const problem_t *p, int layout, int threads,
                         int reps, const sample_t *smp, const single_t *ref, ring_t *r) {
    memset(r, 0, sizeof *r);
    r->layout = layout, r->P = ranks_;
    const ringattn_plan_desc_t d = make_desc(p, layout, threads);
    ringattn_plan_t plan = NULL;
    outputs_t x = {0};
    r->ok = all_ok(api_ok("ringattn_plan_create", ringattn_plan_create(comm, &d, &plan)));
    if (r->ok) r->ok = all_ok(take_rows(plan, p, &x));
    if (r->ok) {
        gather_maps(&p->s, &x, plan, r);
        const ringattn_tensors_t t = tensors_of(&x);
        r->ok = timed_pass(plan, &t, 0, reps, r) && timed_pass(plan, &t, 1, reps, r);
        r->timed = 1;
        if (r->ok) check_ring_mpi(&p->s, smp, &x, ref, r);
    }
    outputs_free(&x);
    ringattn_plan_destroy(plan);
}

/* ---------------------------------------------------------------- the same over threads */

typedef struct {
    int r;
    ringattn_comm_t comm;
    const problem_t *p;
    ringattn_plan_desc_t desc;
    pthread_barrier_t *bar;
    int reps;
    outputs_t x;
    ringattn_plan_info_t info;
    double fwd_s, bwd_s, copy_fwd_s, copy_bwd_s;
    int ok;
} th_rank_t;

/* Time of copying `bytes` between two buffers, as the threads transport's receiver does. */
static double copy_time(size_t bytes) {
    if (!bytes) return 0.0;
    char *a = xmalloc(bytes), *b = xmalloc(bytes);
    memset(a, 1, bytes), memset(b, 0, bytes);
    const double t0 = now();
    memcpy(b, a, bytes);
    const double dt = now() - t0;
    free(a), free(b);
    return dt;
}

static void *th_main(void *arg) {
    th_rank_t *c = arg;
    ringattn_plan_t plan = NULL;
    c->ok = api_ok("ringattn_plan_create", ringattn_plan_create(c->comm, &c->desc, &plan));
    if (c->ok) c->ok = take_rows(plan, c->p, &c->x);
    c->info = (ringattn_plan_info_t)RINGATTN_PLAN_INFO_INIT;
    if (c->ok) c->ok = api_ok("ringattn_plan_get_info", ringattn_plan_get_info(plan, &c->info));
    const ringattn_tensors_t t = tensors_of(&c->x);
    c->fwd_s = c->bwd_s = INFINITY;
    for (int rep = 0; rep < c->reps; ++rep) { /* every thread reaches every barrier */
        pthread_barrier_wait(c->bar);
        double t0 = now();
        if (c->ok) c->ok = api_ok("ringattn_forward", ringattn_forward(plan, &t, NULL));
        c->fwd_s = fmin(c->fwd_s, now() - t0);
        pthread_barrier_wait(c->bar);
        t0 = now();
        if (c->ok) c->ok = api_ok("ringattn_backward", ringattn_backward(plan, &t, NULL));
        c->bwd_s = fmin(c->bwd_s, now() - t0);
    }
    pthread_barrier_wait(c->bar); /* the copies, all ranks at once as in the ring */
    c->copy_fwd_s = copy_time(c->info.forward_bytes_received);
    pthread_barrier_wait(c->bar);
    c->copy_bwd_s = copy_time(c->info.backward_bytes_received);
    ringattn_plan_destroy(plan);
    return NULL;
}

/* P ranks as threads of rank 0 (ringattn_comm_create_threads) while the other MPI ranks sleep. */
static void run_ring_threads(const problem_t *p, int layout, int P, int threads, int reps,
                             const sample_t *smp, const single_t *ref, ring_t *r) {
    memset(r, 0, sizeof *r);
    r->layout = layout, r->P = P, r->threads_transport = 1;
    if (rank_ == 0) {
        ringattn_comm_t *comms = xmalloc(sizeof(ringattn_comm_t) * (size_t)P);
        th_rank_t *th = calloc((size_t)P, sizeof *th);
        pthread_t *tid = xmalloc(sizeof(pthread_t) * (size_t)P);
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)P);
        /* mpirun may have bound rank 0 to one core (its default with as many ranks as cores);
           the thread ranks get every core, as the MPI ranks have between them. */
        pthread_attr_t attr;
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE; ++c) CPU_SET((int)c, &cpus);
        pthread_attr_init(&attr);
        pthread_attr_setaffinity_np(&attr, sizeof cpus, &cpus);
        const int have_comms = r->ok = api_ok("ringattn_comm_create_threads", ringattn_comm_create_threads(P, comms));
        for (int i = 0; i < P && r->ok; ++i) {
            th[i] = (th_rank_t){.r = i, .comm = comms[i], .p = p, .desc = make_desc(p, layout, threads),
                                .bar = &bar, .reps = reps};
            pthread_create(&tid[i], &attr, th_main, &th[i]);
        }
        int64_t *count = xmalloc(sizeof(int64_t) * (size_t)P);
        int32_t **tokens = xmalloc(sizeof(int32_t *) * (size_t)P);
        r->info = xmalloc(sizeof(ringattn_plan_info_t) * (size_t)P);
        errs_t e = {0};
        float *recs = xmalloc(sizeof(float) * (size_t)smp->nrows * rec_floats(&p->s));
        int nrec = 0;
        for (int i = 0; i < P && r->ok; ++i) pthread_join(tid[i], NULL);
        for (int i = 0; i < P && r->ok; ++i) r->ok = th[i].ok;
        for (int i = 0; i < P; ++i) {
            count[i] = th[i].x.rows, tokens[i] = th[i].x.tokens, th[i].x.tokens = NULL;
            r->info[i] = th[i].info;
            if (!r->ok) continue;
            r->fwd_s = fmax(r->fwd_s, th[i].fwd_s), r->bwd_s = fmax(r->bwd_s, th[i].bwd_s);
            r->copy_fwd_s = fmax(r->copy_fwd_s, th[i].copy_fwd_s);
            r->copy_bwd_s = fmax(r->copy_bwd_s, th[i].copy_bwd_s);
            th[i].x.tokens = tokens[i];
            const int n = pack_records(&p->s, smp, &th[i].x, recs);
            th[i].x.tokens = NULL;
            compare_records(&p->s, recs, n, &ref->out, &e), nrec += n;
        }
        if (r->ok) {
            for (int i = 0; i < P; ++i) tokens[i] = tokens[i] ? tokens[i] : calloc(1, sizeof(int32_t));
            map_build(&r->map, &p->s, P, count, tokens);
            r->err_fwd = nrec == smp->nrows ? err_fwd(&e) : INFINITY;
            r->err_bwd = nrec == smp->nrows ? err_bwd(&e) : INFINITY;
        } else {
            for (int i = 0; i < P; ++i) free(tokens[i]);
            free(count), free(tokens);
        }
        for (int i = 0; i < P; ++i) {
            outputs_free(&th[i].x);
            if (have_comms) ringattn_comm_destroy(comms[i]);
        }
        pthread_barrier_destroy(&bar);
        pthread_attr_destroy(&attr);
        free(recs), free(comms), free(th), free(tid);
    }
    idle_barrier();
    MPI_Bcast(&r->ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- the exchange alone */

/* The ring's messages without the compute, in the library's order (ring/ring.c): per step the
   K/V of the held shard to the next rank while it travels on; in the backward then its float32
   dK/dV sums behind it, and the finished sums of a shard whose journey ends here straight back
   to the owner. The owner keeps its own part of the sums, so they travel from the first hop on.
   Bytes are tallied to compare with ringattn_plan_get_info. Best of reps, slowest rank. */
static int held(int P, int r, int t) { return ((r - t) % P + P) % P; }

static void exchange(const void *out, size_t n_out, int to, void *in, size_t n_in, int from,
                     int tag, MPI_Request *rq, int *nrq, double *sent, double *recv) {
    if (n_in) MPI_Irecv(in, (int)n_in, MPI_BYTE, from, tag, MPI_COMM_WORLD, &rq[(*nrq)++]);
    if (n_out) MPI_Isend(out, (int)n_out, MPI_BYTE, to, tag, MPI_COMM_WORLD, &rq[(*nrq)++]);
    *sent += (double)n_out, *recv += (double)n_in;
}

static void exchange_pass(const shape_t *s, const ring_map_t *m, int bwd, char *buf[4],
                          double tally[2]) {
    const int P = m->P, r = rank_, prev = (r - 1 + P) % P;
    for (int t = 0; t < m->N; ++t) {
        MPI_Request rq[6];
        int nrq = 0;
        const int h = held(P, r, t), hp = held(P, prev, t);
        const size_t out = t < m->last_hop[h] ? (size_t)kv_bytes(s, m, h) : 0;
        const size_t in = t < m->last_hop[hp] ? (size_t)kv_bytes(s, m, hp) : 0;
        if (t + 1 < m->N) exchange(buf[0], out, (r + 1) % P, buf[1], in, prev, 0, rq, &nrq, &tally[0], &tally[1]);
        MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE), nrq = 0;
        if (!bwd) continue;
        if (t > 0 && t + 1 < m->N)
            exchange(buf[2], out, (r + 1) % P, buf[3], in, prev, 1, rq, &nrq, &tally[0], &tally[1]);
        const size_t home = t > 0 && m->last_hop[h] == t ? (size_t)kv_bytes(s, m, h) : 0;
        const size_t mine = t > 0 && m->last_hop[r] == t ? (size_t)kv_bytes(s, m, r) : 0;
        exchange(buf[2], home, h, buf[1], mine, (r + t) % P, 2, rq, &nrq, &tally[0], &tally[1]);
        MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE);
    }
}

typedef struct {
    double fwd_s, bwd_s;   /* slowest rank */
    double bytes[2][2];    /* this rank's [fwd, bwd][sent, received] */
} exch_t;

static void run_exchange(const shape_t *s, const ring_map_t *m, int reps, exch_t *x) {
    size_t big = 1;
    for (int i = 0; i < m->P; ++i) big = (size_t)kv_bytes(s, m, i) > big ? (size_t)kv_bytes(s, m, i) : big;
    char *buf[4];
    for (int i = 0; i < 4; ++i) buf[i] = xmalloc(big), memset(buf[i], 0, big);
    for (int bwd = 0; bwd < 2; ++bwd) {
        double best = INFINITY;
        for (int rep = 0; rep < reps; ++rep) {
            double tally[2] = {0, 0};
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            exchange_pass(s, m, bwd, buf, tally);
            best = fmin(best, MPI_Wtime() - t0);
            x->bytes[bwd][0] = tally[0], x->bytes[bwd][1] = tally[1];
        }
        MPI_Allreduce(&best, bwd ? &x->bwd_s : &x->fwd_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    for (int i = 0; i < 4; ++i) free(buf[i]);
}

/* ---------------------------------------------------------------- reporting (rank 0) */

static void table_header(void) {
    printf("%6s %5s %4s %-8s %-7s %5s %4s %10s %8s %6s %5s\n", "seq", "heads", "dim", "mask",
           "layout", "ranks", "pass", "time_ms", "GFLOP/s", "eff%", "wrong");
}

/* One row; secs < 0: not timed (traffic-only case); eff < 0: none (single rank). */
static void table_row(const shape_t *s, const char *layout, int ranks, int bwd, double secs,
                      double eff, double err, int ok, const char *transport) {
    if (rank_ != 0) return;
    char mask[32], t[32] = "-", g[32] = "-", e[32] = "-";
    mask_name(s, mask, sizeof mask);
    const int wrong = !ok || !(err <= (bwd ? 1e-4 : 1e-5)); /* SPEC 9, float32 */
    if (secs >= 0) snprintf(t, sizeof t, "%.1f", 1e3 * secs), snprintf(g, sizeof g, "%.1f", flop(s, bwd) / secs * 1e-9);
    if (eff >= 0) snprintf(e, sizeof e, "%.1f", 100.0 * eff);
    printf("%6d %5d %4d %-8s %-7s %5d %4s %10s %8s %6s %5d\n", s->T, s->H, s->D, mask, layout,
           ranks, bwd ? "bwd" : "fwd", t, g, e, wrong);
    fflush(stdout);
    if (wrong) {
        ++failures;
        fprintf(stderr, "bench_ring: WRONG: seq %d mask %s layout %s ranks %d %s: rel err %.3g%s\n",
                s->T, mask, layout, ranks, bwd ? "bwd" : "fwd", err, ok ? "" : " (failed)");
    }
    if (json)
        fprintf(json,
                "{\"type\":\"result\",\"seq\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,"
                "\"mask\":\"%s\",\"layout\":\"%s\",\"ranks\":%d,\"transport\":\"%s\",\"pass\":\"%s\","
                "\"time_ms\":%s,\"gflops\":%s,\"eff_pct\":%s,\"rel_err\":%.3g,\"wrong\":%d}\n",
                s->T, s->H, s->HKV, s->D, mask, layout, ranks, transport, bwd ? "bwd" : "fwd",
                secs >= 0 ? t : "null", secs >= 0 ? g : "null", eff >= 0 ? e : "null", err, wrong);
}

static void report_single(const shape_t *s, const single_t *r) {
    for (int bwd = 0; bwd < 2; ++bwd)
        table_row(s, "single", 1, bwd, r->ok ? (bwd ? r->bwd_s : r->fwd_s) : -1.0, -1.0,
                  r->ok ? (bwd ? r->err_bwd : r->err_fwd) : INFINITY, r->ok, "none");
}

static void report_ring(const shape_t *s, const ring_t *r, const single_t *ref) {
    const char *tr = r->threads_transport ? "threads" : "mpi";
    for (int bwd = 0; bwd < 2; ++bwd) {
        const double secs = bwd ? r->bwd_s : r->fwd_s, one = bwd ? ref->bwd_s : ref->fwd_s;
        const int timed = r->ok && r->timed;
        table_row(s, layout_names[r->layout], r->P, bwd, timed ? secs : -1.0,
                  timed && ref->ok ? one / (r->P * secs) : -1.0,
                  r->ok ? (bwd ? r->err_bwd : r->err_fwd) : INFINITY, r->ok, tr);
    }
}

/* A ring result that gets no table row still counts when wrong. */
static void check_quietly(const shape_t *s, const ring_t *r) {
    if (rank_ != 0) return;
    for (int bwd = 0; bwd < 2; ++bwd) {
        const double err = r->ok ? (bwd ? r->err_bwd : r->err_fwd) : INFINITY;
        if (err <= (bwd ? 1e-4 : 1e-5)) continue;
        ++failures;
        fprintf(stderr, "bench_ring: WRONG: seq %d layout %s ranks %d over threads %s: rel err %.3g\n",
                s->T, layout_names[r->layout], r->P, bwd ? "bwd" : "fwd", err);
    }
}

typedef struct {
    shape_t s;
    ring_t *ring;
    double ratio[2]; /* bytes sent by all ranks / lower bound, fwd and bwd */
} traffic_entry_t;

static traffic_entry_t traffic[16];
static int ntraffic;

static void remember_traffic(const shape_t *s, ring_t *r) {
    if (rank_ == 0 && r->ok && ntraffic < 16) traffic[ntraffic++] = (traffic_entry_t){*s, r, {NAN, NAN}};
}

/* Per rank: steps, compute steps, bytes sent / received per call against the bytes it needs;
   per configuration: totals against the lower bound. Returns the worst forward ratio. */
static void print_traffic(void) {
    printf("# traffic per call, MB (1e6 bytes): sent/recv = ringattn_plan_get_info; need = K/V of\n"
           "# the other shards this rank has an allowed pair with (what it must receive at least);\n"
           "# bound = sum over shards of their bytes x the OTHER ranks that need them (bwd: K/V +\n"
           "# float32 dK/dV). steps = ring steps of P; computes = steps at which the rank computes\n");
    printf("%6s %-8s %-7s %5s %5s %4s %8s %9s %9s %9s %9s %9s\n", "seq", "mask", "layout", "ranks",
           "steps", "rank", "computes", "fwd_sent", "fwd_recv", "fwd_need", "bwd_sent", "bwd_recv");
    for (int k = 0; k < ntraffic; ++k) {
        const shape_t *s = &traffic[k].s;
        const ring_t *r = traffic[k].ring;
        const ring_map_t *m = &r->map;
        char mask[32];
        mask_name(s, mask, sizeof mask);
        double bf, bb, *need = xmalloc(sizeof(double) * (size_t)m->P), sf = 0, sb = 0;
        lower_bound(s, m, &bf, &bb, need);
        for (int i = 0; i < m->P; ++i) {
            const ringattn_plan_info_t *in = &r->info[i];
            printf("%6d %-8s %-7s %5d %2d/%-2d %4d %8d %9.2f %9.2f %9.2f %9.2f %9.2f\n", s->T, mask,
                   layout_names[r->layout], r->P, in->num_steps, r->P, i, in->compute_steps,
                   in->forward_bytes_sent * 1e-6, in->forward_bytes_received * 1e-6, need[i] * 1e-6,
                   in->backward_bytes_sent * 1e-6, in->backward_bytes_received * 1e-6);
            sf += (double)in->forward_bytes_sent, sb += (double)in->backward_bytes_sent;
            if (in->num_steps != m->N)
                printf("#   warning: rank %d: the library's plan has %d steps, the mask needs %d\n", i,
                       in->num_steps, m->N);
            if (json)
                fprintf(json,
                        "{\"type\":\"traffic\",\"seq\":%d,\"mask\":\"%s\",\"layout\":\"%s\",\"ranks\":%d,"
                        "\"transport\":\"%s\",\"rank\":%d,\"steps\":%d,\"compute_steps\":%d,"
                        "\"fwd_sent\":%zu,\"fwd_recv\":%zu,\"fwd_need\":%.0f,\"bwd_sent\":%zu,"
                        "\"bwd_recv\":%zu}\n",
                        s->T, mask, layout_names[r->layout], r->P,
                        r->threads_transport ? "threads" : "mpi", i, in->num_steps,
                        in->compute_steps, in->forward_bytes_sent, in->forward_bytes_received,
                        need[i], in->backward_bytes_sent, in->backward_bytes_received);
        }
        printf("#   total: fwd %.2f MB sent, lower bound %.2f MB (x%.2f); bwd %.2f MB, bound %.2f MB "
               "(x%.2f)%s\n", sf * 1e-6, bf * 1e-6, bf > 0 ? sf / bf : 1.0, sb * 1e-6, bb * 1e-6,
               bb > 0 ? sb / bb : 1.0, r->threads_transport ? " [threads transport]" : "");
        if (json)
            fprintf(json,
                    "{\"type\":\"traffic_total\",\"seq\":%d,\"mask\":\"%s\",\"layout\":\"%s\","
                    "\"ranks\":%d,\"steps\":%d,\"fwd_sent\":%.0f,\"fwd_bound\":%.0f,"
                    "\"bwd_sent\":%.0f,\"bwd_bound\":%.0f}\n",
                    s->T, mask, layout_names[r->layout], r->P, m->N, sf, bf, sb, bb);
        traffic[k].ratio[0] = bf > 0 ? sf / bf : 1.0, traffic[k].ratio[1] = bb > 0 ? sb / bb : 1.0;
        free(need);
    }
}

typedef struct {
    shape_t s;
    const ring_t *mpi, *threads;
    exch_t ex;
} overlap_t;

/* Two estimates of the fraction of the exchange hidden behind compute (1 = all of it, 0 =
   none, below 0 = the ring lost more than the exchange alone takes):
   from times:  (compute + exchange - ring) / exchange, compute = the threads ring minus its copies;
   from PMPI:   1 - in_mpi / exchange, in_mpi = the time the ring spent inside MPI calls, i.e.
                ring - compute measured inside the same run rather than as a difference of two. */
static double hidden_times(const overlap_t *o, int bwd, double *compute) {
    const double ring = bwd ? o->mpi->bwd_s : o->mpi->fwd_s;
    const double ex = bwd ? o->ex.bwd_s : o->ex.fwd_s;
    *compute = bwd ? o->threads->bwd_s - o->threads->copy_bwd_s : o->threads->fwd_s - o->threads->copy_fwd_s;
    return ex > 0 ? (*compute + ex - ring) / ex : NAN;
}

static double hidden_pmpi(const overlap_t *o, int bwd) {
    const double ex = bwd ? o->ex.bwd_s : o->ex.fwd_s;
    return ex > 0 ? 1.0 - (bwd ? o->mpi->mpi_bwd_s : o->mpi->mpi_fwd_s) / ex : NAN;
}

static void print_overlap(const overlap_t *ov, int n) {
    printf("# overlap, zigzag: ring = the MPI ring (slowest rank); compute = the same shards over the\n"
           "# threads transport minus its in-process copies; exchange = the ring's messages alone\n"
           "# (MPI_Isend/Irecv, same bytes, same order); hidden = (compute + exchange - ring) /\n"
           "# exchange; in_mpi = time the ring spent inside MPI calls (PMPI), hid_mpi = 1 - in_mpi /\n"
           "# exchange; max_call = the longest single MPI call (a whole shard copied at once)\n");
    printf("%6s %5s %3s %4s %-8s %5s %4s %9s %10s %11s %7s %9s %7s %11s\n", "seq", "heads", "kv",
           "dim", "mask", "ranks", "pass", "ring_ms", "compute_ms", "exchange_ms", "hidden",
           "in_mpi_ms", "hid_mpi", "max_call_ms");
    for (int k = 0; k < n; ++k) {
        const overlap_t *o = &ov[k];
        char mask[32];
        mask_name(&o->s, mask, sizeof mask);
        for (int bwd = 0; bwd < 2; ++bwd) {
            double compute;
            const double h = hidden_times(o, bwd, &compute), hm = hidden_pmpi(o, bwd);
            const double ring = bwd ? o->mpi->bwd_s : o->mpi->fwd_s, ex = bwd ? o->ex.bwd_s : o->ex.fwd_s;
            const double in_mpi = bwd ? o->mpi->mpi_bwd_s : o->mpi->mpi_fwd_s;
            printf("%6d %5d %3d %4d %-8s %5d %4s %9.1f %10.1f %11.1f %7.2f %9.1f %7.2f %11.1f\n",
                   o->s.T, o->s.H, o->s.HKV, o->s.D, mask, o->mpi->P, bwd ? "bwd" : "fwd",
                   1e3 * ring, 1e3 * compute, 1e3 * ex, h, 1e3 * in_mpi, hm,
                   1e3 * o->mpi->mpi_max_s[bwd]);
            if (json)
                fprintf(json,
                        "{\"type\":\"overlap\",\"seq\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,"
                        "\"mask\":\"%s\",\"layout\":\"zigzag\",\"ranks\":%d,\"pass\":\"%s\","
                        "\"ring_ms\":%.3f,\"compute_ms\":%.3f,\"exchange_ms\":%.3f,\"hidden\":%.4f,"
                        "\"in_mpi_ms\":%.3f,\"hidden_pmpi\":%.4f,\"mpi_calls\":%ld,\"max_call_ms\":%.3f}\n",
                        o->s.T, o->s.H, o->s.HKV, o->s.D, mask, o->mpi->P, bwd ? "bwd" : "fwd",
                        1e3 * ring, 1e3 * compute, 1e3 * ex, h, 1e3 * in_mpi, hm,
                        o->mpi->mpi_calls[bwd], 1e3 * o->mpi->mpi_max_s[bwd]);
        }
        for (int bwd = 0; bwd < 2; ++bwd) /* the emulation must move what the library moves */
            if (o->ex.bytes[bwd][0] != (double)(bwd ? o->mpi->info[0].backward_bytes_sent
                                                    : o->mpi->info[0].forward_bytes_sent))
                printf("#   warning: the exchange loop sent %.0f bytes %s on rank 0, the library %zu\n",
                       o->ex.bytes[bwd][0], bwd ? "bwd" : "fwd",
                       bwd ? o->mpi->info[0].backward_bytes_sent : o->mpi->info[0].forward_bytes_sent);
    }
}

/* ---------------------------------------------------------------- options */

typedef struct {
    shape_t main;              /* efficiency: causal at this shape, every layout in layouts */
    int layouts[NUM_LAYOUTS], nlayouts;
    int threads;               /* per rank; 0 = the node's cores divided among its ranks */
    int reps, sample;
    shape_t win;               /* traffic only: window narrower than a shard ... */
    int win_ranks;             /* ... on this many ranks; 0 = skip */
    int overlap;               /* compute-only and exchange-only times for zigzag */
    shape_t heavy;             /* overlap: an exchange-heavy shape (MHA, narrow window); T 0 = skip */
    const char *json_path;
    int no_json;
} options_t;

static void usage(void) {
    printf("usage: mpirun -n P bench_ring [--seq T] [--heads H] [--kv-heads HKV] [--dim D]\n"
           "                  [--layout LIST] [--threads N] [--reps N] [--sample ROWS]\n"
           "                  [--window-seq T] [--window W] [--window-ranks P] [--no-window]\n"
           "                  [--heavy-seq T] [--heavy-heads H] [--heavy-window W] [--no-overlap]\n"
           "                  [--quick] [--json FILE] [--no-json]\n"
           "defaults: --seq 16384 --heads 8 --kv-heads 2 --dim 128 (causal) --layout\n"
           "  contiguous,zigzag,striped --threads 0 (cores / ranks on the node, at least 1)\n"
           "  --reps 1 --sample 16; traffic case --window-seq 16384 --window 1024\n"
           "  --window-ranks 4 (over MPI if the job has that many ranks, else over threads in\n"
           "  rank 0); overlap case --heavy-seq 16384 --heavy-heads 8 (= kv heads) --heavy-window\n"
           "  256, zigzag. --quick: T 2048, heads 2/1, D 64, window 128, heavy T 4096 (a smoke run).\n");
}

static int parse_layouts(const char *v, options_t *o) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    o->nlayouts = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int l = -1;
        for (int i = 0; i < NUM_LAYOUTS; ++i)
            if (!strcmp(tok, layout_names[i])) l = i;
        if (!strcmp(tok, "contiguous")) l = 0;
        if (l < 0 || o->nlayouts == NUM_LAYOUTS) return 0;
        o->layouts[o->nlayouts++] = l;
    }
    return o->nlayouts > 0;
}

static int parse(int argc, char **argv, options_t *o) {
    memset(o, 0, sizeof *o);
    o->main = (shape_t){16384, 8, 2, 128, 0};
    o->nlayouts = 3, o->layouts[0] = 0, o->layouts[1] = 1, o->layouts[2] = 2;
    o->reps = 1, o->sample = 16, o->overlap = 1;
    o->win = (shape_t){16384, 8, 2, 128, 1024};
    o->win_ranks = 4;
    o->heavy = (shape_t){16384, 8, 8, 128, 256};
    const int say = rank_ == 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { if (say) usage(); return -1; }
        if (!strcmp(a, "--no-window")) { o->win_ranks = 0; continue; }
        if (!strcmp(a, "--no-overlap")) { o->overlap = 0; continue; }
        if (!strcmp(a, "--no-json")) { o->no_json = 1; continue; }
        if (!strcmp(a, "--quick")) {
            o->main = (shape_t){2048, 2, 1, 64, 0};
            o->win = (shape_t){2048, 2, 1, 64, 128};
            o->heavy = (shape_t){4096, 2, 2, 64, 64};
            continue;
        }
        if (!v) { if (say) fprintf(stderr, "bench_ring: %s: missing value or unknown flag\n", a); return 0; }
        ++i;
        int ok = 1;
        if (!strcmp(a, "--seq")) o->main.T = atoi(v);
        else if (!strcmp(a, "--heads")) o->main.H = o->win.H = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->main.HKV = o->win.HKV = atoi(v);
        else if (!strcmp(a, "--dim")) o->main.D = o->win.D = o->heavy.D = atoi(v);
        else if (!strcmp(a, "--layout")) ok = parse_layouts(v, o);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--sample")) o->sample = atoi(v);
        else if (!strcmp(a, "--window-seq")) o->win.T = atoi(v);
        else if (!strcmp(a, "--window")) o->win.window = atoi(v);
        else if (!strcmp(a, "--window-ranks")) o->win_ranks = atoi(v);
        else if (!strcmp(a, "--heavy-seq")) o->heavy.T = atoi(v);
        else if (!strcmp(a, "--heavy-heads")) o->heavy.H = o->heavy.HKV = atoi(v);
        else if (!strcmp(a, "--heavy-window")) o->heavy.window = atoi(v);
        else if (!strcmp(a, "--json")) o->json_path = v;
        else ok = 0;
        if (!ok) { if (say) fprintf(stderr, "bench_ring: %s %s: unknown flag or bad value (see --help)\n", a, v); return 0; }
    }
    const shape_t *all[3] = {&o->main, &o->win, &o->heavy};
    for (int k = 0; k < 3; ++k) {
        const shape_t *s = all[k];
        if ((k == 1 && o->win_ranks == 0) || (k == 2 && (o->heavy.T == 0 || !o->overlap))) continue;
        if (s->T < 1 || s->T > (1 << 24) || s->H < 1 || s->HKV < 1 || s->H % s->HKV || s->D < 1 ||
            s->D > 256 || s->window < -1) {
            if (say) fprintf(stderr, "bench_ring: invalid shape (T <= 2^24, H a multiple of HKV, D <= 256)\n");
            return 0;
        }
    }
    if (o->reps < 1 || o->sample < 1 || o->threads < 0 || o->win_ranks < 0 || o->win.window < 1) {
        if (say) fprintf(stderr, "bench_ring: invalid options (see --help)\n");
        return 0;
    }
    return 1;
}

static int threads_per_rank(void) {
    MPI_Comm node;
    int local = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > local ? (int)(cores / local) : 1;
}

/* ---------------------------------------------------------------- main */

static void print_banner(const options_t *o, int threads) {
    const char *core = openblas_get_corename();
    printf("# ringattn %s bench_ring: backend cpu, transport mpi, ranks %d, threads per rank %d, "
           "float32\n", ringattn_version_string(), ranks_, threads);
    printf("# BLAS: %s (kernels: %s)%s\n", openblas_get_config(), core,
           !strcmp(core, "Prescott") ? " -- generic kernels: set OPENBLAS_CORETYPE (bench/README.md)" : "");
    printf("# efficiency: causal, T %d, heads %d/%d, D %d; eff%% = single-rank time / (ranks x ring "
           "time), single rank = rank 0 alone with %d thread(s)\n",
           o->main.T, o->main.H, o->main.HKV, o->main.D, threads);
    printf("# GFLOP/s counts allowed pairs only: fwd 4*D, bwd 10*D flop per pair per head; wrong = "
           "a sampled row off the single-rank result (or that off float64) beyond SPEC 9\n");
    if (json)
        fprintf(json, "{\"type\":\"banner\",\"version\":\"%s\",\"backend\":\"cpu\",\"transport\":\"mpi\","
                      "\"ranks\":%d,\"threads_per_rank\":%d,\"blas_core\":\"%s\"}\n",
                ringattn_version_string(), ranks_, threads, core);
}

static void print_figures(const ring_t *zz, const single_t *one, const overlap_t *ov, int nov) {
    printf("# tracked figures:\n");
    double eff[2] = {NAN, NAN};
    for (int bwd = 0; zz && zz->ok && one->ok && bwd < 2; ++bwd)
        eff[bwd] = (bwd ? one->bwd_s : one->fwd_s) / (zz->P * (bwd ? zz->bwd_s : zz->fwd_s));
    for (int bwd = 0; bwd < 2; ++bwd) {
        printf("#   causal zigzag efficiency, %s, P = %d: %.3f (target >= 0.85: %s)\n",
               bwd ? "backward" : "forward ", zz ? zz->P : 0, eff[bwd],
               !isfinite(eff[bwd]) ? "not measured" : eff[bwd] >= 0.85 ? "met" : "MISSED");
        if (json)
            fprintf(json, "{\"type\":\"figure\",\"name\":\"%s\",\"value\":%.4f,\"target\":0.85}\n",
                    bwd ? "zigzag_causal_bwd_eff" : "zigzag_causal_fwd_eff", isfinite(eff[bwd]) ? eff[bwd] : -1.0);
    }
    printf("#   bytes sent / lower bound (1 = only what the mask needs), forward / backward:\n");
    for (int k = 0; k < ntraffic; ++k) {
        char mask[32];
        mask_name(&traffic[k].s, mask, sizeof mask);
        printf("#     %-8s %-7s P = %d: %.2f / %.2f\n", mask, layout_names[traffic[k].ring->layout],
               traffic[k].ring->P, traffic[k].ratio[0], traffic[k].ratio[1]);
    }
    for (int k = 0; k < nov; ++k) {
        const overlap_t *o = &ov[k];
        char mask[32];
        double c, h[2] = {hidden_times(o, 0, &c), hidden_times(o, 1, &c)};
        const double hm[2] = {hidden_pmpi(o, 0), hidden_pmpi(o, 1)};
        mask_name(&o->s, mask, sizeof mask);
        printf("#   exchange hidden, %s heads %d/%d: forward %.2f (PMPI) / %.2f (times), backward %.2f / "
               "%.2f; the exchange alone is %.1f%% / %.1f%% of the ring time\n", mask, o->s.H, o->s.HKV,
               hm[0], h[0], hm[1], h[1], 100.0 * o->ex.fwd_s / o->mpi->fwd_s,
               100.0 * o->ex.bwd_s / o->mpi->bwd_s);
        if (json)
            fprintf(json, "{\"type\":\"figure\",\"name\":\"hidden_%s_h%d_kv%d\",\"fwd_pmpi\":%.4f,"
                          "\"fwd_times\":%.4f,\"bwd_pmpi\":%.4f,\"bwd_times\":%.4f}\n",
                    mask, o->s.H, o->s.HKV, hm[0], h[0], hm[1], h[1]);
    }
}

/* Efficiency: the single-rank reference, then every layout over MPI. */
static void run_main(ringattn_comm_t comm, const options_t *o, int threads, problem_t *pb,
                     single_t *one, ring_t *rings, const sample_t *smp) {
    run_single(pb, threads, o->reps, smp, one);
    report_single(&pb->s, one);
    for (int i = 0; i < o->nlayouts; ++i) {
        run_ring_mpi(comm, pb, o->layouts[i], threads, o->reps, smp, one, &rings[i]);
        report_ring(&pb->s, &rings[i], one);
        remember_traffic(&pb->s, &rings[i]);
    }
}

/* Overlap of one shape: the MPI ring's zigzag result, compute over threads, exchange alone. */
static void run_overlap(const problem_t *pb, int threads, int reps, const sample_t *smp,
                        const single_t *one, const ring_t *mpi, ring_t *th, overlap_t *ov) {
    run_ring_threads(pb, 1, ranks_, threads, reps, smp, one, th);
    check_quietly(&pb->s, th); /* checked like every ring, but no table row */
    memset(ov, 0, sizeof *ov);
    ov->s = pb->s, ov->mpi = mpi, ov->threads = th;
    run_exchange(&pb->s, &mpi->map, 3, &ov->ex);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    openblas_set_num_threads(1); /* ranks as threads share OpenBLAS's setting; tiles are small */
    options_t o;
    const int parsed = parse(argc, argv, &o);
    if (parsed <= 0) {
        MPI_Finalize();
        return parsed < 0 ? 0 : 2;
    }
    const int threads = o.threads ? o.threads : threads_per_rank();
    if (rank_ == 0 && !o.no_json) {
        json = o.json_path ? fopen(o.json_path, "w") : tmpfile();
        if (!json) perror(o.json_path ? o.json_path : "tmpfile");
    }
    ringattn_comm_t comm = NULL;
    if (!all_ok(api_ok("ringattn_comm_create_mpi", ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm)))) {
        MPI_Finalize();
        return 2;
    }
    if (rank_ == 0) print_banner(&o, threads), table_header();

    /* 1. efficiency (and its traffic) */
    problem_t pb;
    sample_t smp;
    single_t one;
    ring_t rings[NUM_LAYOUTS];
    problem_init(&pb, o.main, 42);
    sample_init(&smp, o.main.T, o.sample, 7);
    run_main(comm, &o, threads, &pb, &one, rings, &smp);
    const ring_t *zz = NULL;
    for (int i = 0; i < o.nlayouts; ++i)
        if (o.layouts[i] == 1 && rings[i].ok) zz = &rings[i];

    /* 3. overlap: the main shape and an exchange-heavy one, zigzag */
    overlap_t ov[2];
    ring_t th[2], heavy_ring;
    single_t heavy_one;
    problem_t hp;
    sample_t hsmp;
    int nov = 0;
    if (o.overlap && zz) {
        run_overlap(&pb, threads, o.reps, &smp, &one, zz, &th[0], &ov[nov]);
        nov += th[0].ok;
    }
    problem_free(&pb), outputs_free(&one.out);
    if (o.overlap && o.heavy.T > 0) {
        problem_init(&hp, o.heavy, 43);
        sample_init(&hsmp, o.heavy.T, o.sample, 8);
        const int hreps = o.reps > 3 ? o.reps : 3; /* short runs: best of 3 at least */
        run_single(&hp, threads, hreps, &hsmp, &heavy_one);
        report_single(&hp.s, &heavy_one);
        run_ring_mpi(comm, &hp, 1, threads, hreps, &hsmp, &heavy_one, &heavy_ring);
        report_ring(&hp.s, &heavy_ring, &heavy_one);
        remember_traffic(&hp.s, &heavy_ring);
        if (heavy_ring.ok) {
            run_overlap(&hp, threads, hreps, &hsmp, &heavy_one, &heavy_ring, &th[1], &ov[nov]);
            nov += th[1].ok;
        }
        problem_free(&hp), outputs_free(&heavy_one.out), free(hsmp.rows);
    }

    /* 2. traffic: a window narrower than a shard, every layout; checked, not timed */
    ring_t wr[NUM_LAYOUTS];
    single_t wone;
    problem_t wp;
    sample_t wsmp;
    const int nw = o.win_ranks > 1 ? o.nlayouts : 0;
    if (nw) {
        problem_init(&wp, o.win, 44);
        sample_init(&wsmp, o.win.T, o.sample, 9);
        run_single(&wp, threads, 1, &wsmp, &wone);
        report_single(&wp.s, &wone);
        for (int i = 0; i < nw; ++i) {
            if (o.win_ranks == ranks_) run_ring_mpi(comm, &wp, o.layouts[i], threads, 1, &wsmp, &wone, &wr[i]);
            else run_ring_threads(&wp, o.layouts[i], o.win_ranks, 1, 1, &wsmp, &wone, &wr[i]);
            wr[i].timed = 0;
            report_ring(&wp.s, &wr[i], &wone);
            remember_traffic(&wp.s, &wr[i]);
        }
        problem_free(&wp), outputs_free(&wone.out), free(wsmp.rows);
    }

    if (rank_ == 0) {
        print_traffic();
        if (nov) print_overlap(ov, nov);
        print_figures(zz, &one, ov, nov);
        if (json && !o.json_path) { /* JSON lines after the tables */
            rewind(json);
            char line[2048];
            while (fgets(line, sizeof line, json)) fputs(line, stdout);
        }
        if (json) fclose(json);
        if (failures) printf("# %d wrong or failed result(s)\n", failures);
    }
    MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int i = 0; i < o.nlayouts; ++i) ring_free(&rings[i]);
    for (int i = 0; i < nw; ++i) ring_free(&wr[i]);
    for (int i = 0; o.overlap && i < 2; ++i)
        if ((i == 0 && zz) || (i == 1 && o.heavy.T > 0 && heavy_ring.ok)) ring_free(&th[i]);
    if (o.overlap && o.heavy.T > 0) ring_free(&heavy_ring);
    free(smp.rows);
    ringattn_comm_destroy(comm);
    MPI_Finalize();
    return failures ? 1 : 0;
}
