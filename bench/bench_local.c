/*
 * bench_local: single-rank ringattn (CPU backend, or --backend cuda) against the machine's
 * sgemm ceiling.
 *
 * Prints a '#' banner (version, backend, threads, ranks, sgemm GFLOP/s measured in this run),
 * then a table
 *     seq heads dim mask layout ranks threads pass time_ms GFLOP/s eff% wrong
 * and JSON lines (stdout, or --json FILE). GFLOP/s counts allowed (unmasked) query-key pairs
 * only: forward 4*D flop per pair per head (D_v = D), backward 10*D (2.5x forward, as
 * FlashAttention counts). eff% = GFLOP/s / sgemm GFLOP/s (2048^3) at the same thread count.
 * Each configuration is checked on a sample of rows (all heads) against float64: O and LSE
 * (forward, 1e-5 relative), dQ (backward, 1e-4 normwise); wrong = 1 above SPEC 9 tolerance,
 * and any wrong result makes the exit status 1. layout "naive" rows are a dense plain-loop
 * float32 implementation (single thread) at T = 1024, for comparison. --backend cuda runs the
 * same float32 problems on the CUDA backend (device copies of the tensors; each run ends with a
 * device synchronisation): forward and backward, threads 1 (one device), eff% 0 (no ceiling).
 * --dtype f16,bf16 stores Q, K, V, dO and the outputs in that dtype (CPU backend): the inputs are
 * rounded to it first, so the float64 reference sees what the library sees, and the check's
 * tolerance is a few units of the dtype's rounding (outputs are rounded to it).
 *
 * Run with --help for the flags; bench/README.md explains the output. The helpers it shares with
 * the other benchmarks are in common.h.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <ringattn.h>

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "bench_local"
#include "common.h"
#include "../examples/common/example_cuda.h"

enum { MASK_NONE, MASK_CAUSAL, MASK_WINDOW, NUM_MASKS };
static const char *const mask_names[NUM_MASKS] = {"none", "causal", "win1024"};
enum { WINDOW = 1024, MAX_LIST = 16, NAIVE_SEQ = 1024 };

typedef struct {
    int seqs[MAX_LIST], nseqs;
    int dims[MAX_LIST], ndims;
    int masks[MAX_LIST], nmasks;
    int threads[MAX_LIST], nthreads; /* resolved: "all" = omp_get_max_threads() */
    int heads, kv_heads;
    int reps;
    double budget_s;  /* stop repeating a measurement once this much time was spent on it */
    int quad_max_seq[2]; /* none/causal masks only up to this T, [0] 1 thread, [1] more
                            threads (0 = no limit): keeps the default sweep short */
    int sample;
    int naive;
    int quick;
    const char *json_path; /* NULL: JSON lines on stdout after the table */
    int no_json;
    int cuda; /* --backend cuda */
    int dtypes[MAX_LIST], ndtypes; /* ringattn_dtype_t values */
    int block_q, block_k; /* --block: the plan's tiles (0: the library's choice) */
    int counters; /* --counters: the emulation's performance counters, a JSON line per launch */
} options_t;

typedef struct {
    int seq, heads, dim, dtype, mask, threads, naive, bwd;
    double time_ms, gflops, eff, err;
    int wrong;
} result_t;

static result_t *results;
static int nresults, cap_results;

/* ---------------------------------------------------------------- masks (SPEC 3, one sequence) */

static void mask_window(int mask, int *wl, int *wr) {
    *wl = mask == MASK_WINDOW ? WINDOW - 1 : -1;
    *wr = mask == MASK_NONE ? -1 : 0;
}

static void key_range(int mask, int T, int i, int *lo, int *hi) {
    int wl, wr;
    mask_window(mask, &wl, &wr);
    *lo = wl >= 0 && i - wl > 0 ? i - wl : 0;
    *hi = wr >= 0 && i + wr < T - 1 ? i + wr : T - 1;
}

static double allowed_pairs(int mask, int T) {
    double n = 0.0;
    for (int i = 0; i < T; ++i) {
        int lo, hi;
        key_range(mask, T, i, &lo, &hi);
        n += hi >= lo ? hi - lo + 1 : 0;
    }
    return n;
}

/* ---------------------------------------------------------------- problem */

typedef struct {
    int T, H, HKV, D, mask, dtype;
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    /* float16/bfloat16 storage of the same tensors (NULL for float32) */
    uint16_t *hq, *hk, *hv, *hdout, *ho, *hdq, *hdk, *hdv;
} problem_t;

static const char *dtype_name(int dt) {
    return dt == RINGATTN_FLOAT16 ? "f16" : dt == RINGATTN_BFLOAT16 ? "bf16" : "f32";
}

/* n values of x stored in dt (a new array); with round, x itself becomes the stored values */
static uint16_t *stored_copy(float *x, int64_t n, int dt, int round) {
    uint16_t *h = xmalloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) {
        h[i] = half_from_float(x[i], dt);
        if (round) x[i] = float_from_half(h[i], dt);
    }
    return h;
}

static void from_stored(float *x, const uint16_t *h, int64_t n, int dt) {
    for (int64_t i = 0; i < n; ++i) x[i] = float_from_half(h[i], dt);
}

/* SPEC 9 check's tolerance (forward, backward): float32's, or a few units of the dtype's
   rounding u (the outputs are rounded to it; float32 accumulation adds little) */
static double tolerance(int dt, int bwd) {
    const double u = dt == RINGATTN_FLOAT16 ? 0x1p-11 : dt == RINGATTN_BFLOAT16 ? 0x1p-8 : 0.0;
    if (u == 0.0) return bwd ? 1e-4 : 1e-5;
    return (bwd ? 8.0 : 4.0) * u;
}

static void problem_init(problem_t *p, int T, int H, int HKV, int D, int dtype, uint64_t seed) {
    const int64_t nq = (int64_t)T * H * D, nk = (int64_t)T * HKV * D;
    *p = (problem_t){.T = T, .H = H, .HKV = HKV, .D = D, .mask = MASK_NONE, .dtype = dtype};
    p->q = random_floats(nq, &seed);
    p->k = random_floats(nk, &seed);
    p->v = random_floats(nk, &seed);
    p->dout = random_floats(nq, &seed);
    p->o = touched_floats(nq);
    p->lse = touched_floats((int64_t)T * H);
    p->dq = touched_floats(nq);
    p->dk = touched_floats(nk);
    p->dv = touched_floats(nk);
    if (dtype == RINGATTN_FLOAT32) return;
    p->hq = stored_copy(p->q, nq, dtype, 1), p->hdout = stored_copy(p->dout, nq, dtype, 1);
    p->hk = stored_copy(p->k, nk, dtype, 1), p->hv = stored_copy(p->v, nk, dtype, 1);
    p->ho = stored_copy(p->o, nq, dtype, 0), p->hdq = stored_copy(p->dq, nq, dtype, 0);
    p->hdk = stored_copy(p->dk, nk, dtype, 0), p->hdv = stored_copy(p->dv, nk, dtype, 0);
}

/* The outputs of the last run (forward: O; backward: dQ, dK, dV) as float32 for the check. */
static void outputs_to_f32(problem_t *p, int bwd) {
    if (p->dtype == RINGATTN_FLOAT32) return;
    const int64_t nq = (int64_t)p->T * p->H * p->D, nk = (int64_t)p->T * p->HKV * p->D;
    if (!bwd) {
        from_stored(p->o, p->ho, nq, p->dtype);
        return;
    }
    from_stored(p->dq, p->hdq, nq, p->dtype);
    from_stored(p->dk, p->hdk, nk, p->dtype), from_stored(p->dv, p->hdv, nk, p->dtype);
}

static void problem_free(problem_t *p) {
    free(p->q), free(p->k), free(p->v), free(p->o), free(p->lse);
    free(p->dout), free(p->dq), free(p->dk), free(p->dv);
    free(p->hq), free(p->hk), free(p->hv), free(p->hdout);
    free(p->ho), free(p->hdq), free(p->hdk), free(p->hdv);
}

/* ---------------------------------------------------------------- float64 reference, sampled rows */

static void reference_row(const problem_t *p, int i, int h, double *o, double *lse, double *dq) {
    const int D = p->D, hk = h / (p->H / p->HKV);
    int lo, hi;
    key_range(p->mask, p->T, i, &lo, &hi);
    const int64_t at = ((int64_t)i * p->H + h) * D;
    reference_row_range(p->q + at, p->dout + at, p->k, p->v, p->HKV, hk, D, lo, hi, o, lse, dq);
}

static void reference_init(reference_t *r, const problem_t *p, int nrows, uint64_t seed) {
    const int H = p->H, D = p->D;
    reference_alloc(r, nrows, p->T, H, D, 1);
    for (int n = 0; n < r->nrows; ++n) {
        r->rows[n] = sample_row(n, r->nrows, p->T, &seed);
        for (int h = 0; h < H; ++h) {
            const int64_t at = ((int64_t)n * H + h) * D;
            reference_row(p, r->rows[n], h, r->o + at, r->lse + (int64_t)n * H + h, r->dq + at);
        }
    }
}

/* backward: normwise relative error of dQ on the sampled rows; dK, dV only checked finite */
static double backward_error(const problem_t *p, const reference_t *r) {
    const int64_t nq = (int64_t)p->T * p->H * p->D, nk = (int64_t)p->T * p->HKV * p->D;
    if (!all_finite(p->dq, nq) || !all_finite(p->dk, nk) || !all_finite(p->dv, nk)) return INFINITY;
    return dq_error(r, p->H, p->D, p->dq);
}

/* ---------------------------------------------------------------- naive dense float32 */

static void naive_forward(problem_t *p, float *s) {
    const int T = p->T, H = p->H, D = p->D;
    const float scale = 1.0f / sqrtf((float)D);
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
            const int hk = h / (H / p->HKV);
            int lo, hi;
            key_range(p->mask, T, i, &lo, &hi);
            const float *qi = p->q + ((int64_t)i * H + h) * D;
            float m = -INFINITY, l = 0.0f, *o = p->o + ((int64_t)i * H + h) * D;
            for (int j = 0; j < T; ++j) {
                const float *kj = p->k + ((int64_t)j * p->HKV + hk) * D;
                float d = 0.0f;
                for (int c = 0; c < D; ++c) d += qi[c] * kj[c];
                s[j] = j >= lo && j <= hi ? d * scale : -INFINITY;
                m = s[j] > m ? s[j] : m;
            }
            for (int c = 0; c < D; ++c) o[c] = 0.0f;
            for (int j = 0; j < T; ++j) {
                const float *vj = p->v + ((int64_t)j * p->HKV + hk) * D;
                const float e = expf(s[j] - m);
                l += e;
                for (int c = 0; c < D; ++c) o[c] += e * vj[c];
            }
            for (int c = 0; c < D; ++c) o[c] /= l;
            p->lse[(int64_t)h * T + i] = m + logf(l);
        }
}

static void naive_backward(problem_t *p) {
    const int T = p->T, H = p->H, D = p->D;
    const float scale = 1.0f / sqrtf((float)D);
    memset(p->dk, 0, sizeof(float) * (size_t)T * p->HKV * D);
    memset(p->dv, 0, sizeof(float) * (size_t)T * p->HKV * D);
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
            const int hk = h / (H / p->HKV);
            int lo, hi;
            key_range(p->mask, T, i, &lo, &hi);
            const int64_t at = ((int64_t)i * H + h) * D;
            const float *qi = p->q + at, *oi = p->o + at, *di = p->dout + at;
            float *dqi = p->dq + at, dsum = 0.0f;
            for (int c = 0; c < D; ++c) dsum += di[c] * oi[c], dqi[c] = 0.0f;
            for (int j = 0; j < T; ++j) {
                const float *kj = p->k + ((int64_t)j * p->HKV + hk) * D;
                const float *vj = p->v + ((int64_t)j * p->HKV + hk) * D;
                float d = 0.0f, dp = 0.0f;
                for (int c = 0; c < D; ++c) d += qi[c] * kj[c], dp += di[c] * vj[c];
                const float pr = j >= lo && j <= hi ? expf(d * scale - p->lse[(int64_t)h * T + i]) : 0.0f;
                const float ds = pr * (dp - dsum);
                float *dkj = p->dk + ((int64_t)j * p->HKV + hk) * D;
                float *dvj = p->dv + ((int64_t)j * p->HKV + hk) * D;
                for (int c = 0; c < D; ++c) {
                    dqi[c] += scale * ds * kj[c];
                    dkj[c] += scale * ds * qi[c];
                    dvj[c] += pr * di[c];
                }
            }
        }
}

/* ---------------------------------------------------------------- sgemm ceiling */

static double sgemm_gflops(int m, int n, int k, int threads, double min_s) {
    float *a = random_floats((int64_t)m * k, &(uint64_t){1});
    float *b = random_floats((int64_t)k * n, &(uint64_t){2});
    float *c = touched_floats((int64_t)m * n);
    const int saved = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
    double best = INFINITY, spent = 0.0;
    for (int rep = 0; rep < 3 || spent < min_s; ++rep) {
        const double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        const double t = now() - t0;
        best = t < best ? t : best;
        spent += t;
    }
    openblas_set_num_threads(saved);
    free(a), free(b), free(c);
    return 2.0 * m * n * (double)k / best * 1e-9;
}

typedef struct {
    int threads;
    double gflops;
} ceiling_t;
static ceiling_t ceilings[MAX_LIST + 2];
static int nceilings;

static double ceiling_for(int threads) {
    for (int i = 0; i < nceilings; ++i)
        if (ceilings[i].threads == threads) return ceilings[i].gflops;
    const double g = sgemm_gflops(2048, 2048, 2048, threads, 0.0);
    ceilings[nceilings++] = (ceiling_t){threads, g};
    return g;
}

/* ---------------------------------------------------------------- measuring */

static FILE *json;

static void record(const options_t *opt, result_t r) {
    if (nresults == cap_results) {
        cap_results = cap_results ? 2 * cap_results : 64;
        results = realloc(results, sizeof(result_t) * (size_t)cap_results);
    }
    results[nresults++] = r;
    printf("%6d %5d %4d %-5s %-8s %-7s %5d %7d %4s %10.2f %8.1f %5.1f %5d\n", r.seq, r.heads,
           r.dim, dtype_name(r.dtype), mask_names[r.mask], r.naive ? "naive" : "contig", 1, r.threads, r.bwd ? "bwd" : "fwd",
           r.time_ms, r.gflops, r.eff, r.wrong);
    fflush(stdout);
    if (!json) return;
    fprintf(json,
            "{\"type\":\"result\",\"seq\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,\"dtype\":\"%s\",\"mask\":\"%s\","
            "\"layout\":\"%s\",\"ranks\":1,\"threads\":%d,\"pass\":\"%s\",\"time_ms\":%.4f,"
            "\"gflops\":%.3f,\"eff_pct\":%.2f,\"rel_err\":%.3g,\"wrong\":%d}\n",
            r.seq, r.heads, opt->kv_heads, r.dim, dtype_name(r.dtype), mask_names[r.mask], r.naive ? "naive" : "contig",
            r.threads, r.bwd ? "bwd" : "fwd", r.time_ms, r.gflops, r.eff, r.err, r.wrong);
}

typedef int (*run_fn)(void *ctx, int bwd);

/* best of up to opt->reps runs, fewer once budget_s is spent; -1 on failure */
static double measure(const options_t *opt, run_fn fn, void *ctx, int bwd) {
    double best = INFINITY, spent = 0.0;
    for (int rep = 0; rep < opt->reps; ++rep) {
        const double t0 = now();
        if (fn(ctx, bwd)) return -1.0;
        const double t = now() - t0;
        best = t < best ? t : best;
        spent += t;
        if (spent >= opt->budget_s) break;
    }
    return best;
}

typedef struct {
    ringattn_plan_t plan;
    ringattn_tensors_t t;
    const cuda_memory_t *cuda; /* --backend cuda: the call is timed to its end on the device */
} lib_ctx_t;

static int run_lib(void *ctx, int bwd) {
    lib_ctx_t *c = ctx;
    const ringattn_status_t st = bwd ? ringattn_backward(c->plan, &c->t, NULL)
                                     : ringattn_forward(c->plan, &c->t, NULL);
    if (st == RINGATTN_SUCCESS && c->cuda && c->cuda->sync() != 0) {
        fprintf(stderr, "bench_local: cudaDeviceSynchronize failed after the call\n");
        return 1;
    }
    if (st == RINGATTN_SUCCESS) return 0;
    fprintf(stderr, "bench_local: %s: %s: %s\n", bwd ? "ringattn_backward" : "ringattn_forward",
            ringattn_status_string(st), ringattn_last_error());
    return 1;
}

typedef struct {
    problem_t *p;
    float *s;
} naive_ctx_t;

static int run_naive(void *ctx, int bwd) {
    naive_ctx_t *c = ctx;
    if (bwd)
        naive_backward(c->p);
    else
        naive_forward(c->p, c->s);
    return 0;
}

static int failures;

static void report(const options_t *opt, const problem_t *p, const reference_t *ref, int threads,
                   int naive, int bwd, double secs) {
    result_t r = {p->T, p->H, p->D, p->dtype, p->mask, threads, naive, bwd, 0, 0, 0, 0, 1};
    if (secs >= 0) {
        const double flop = allowed_pairs(p->mask, p->T) * p->H * 4.0 * p->D * (bwd ? 2.5 : 1.0);
        r.time_ms = 1e3 * secs;
        r.gflops = flop / secs * 1e-9;
        r.eff = opt->cuda && !naive ? 0.0 : 100.0 * r.gflops / ceiling_for(threads);
        r.err = bwd ? backward_error(p, ref) : forward_error(ref, p->T, p->H, p->D, p->o, p->lse);
        r.wrong = !(r.err <= tolerance(p->dtype, bwd));
    } else {
        r.err = INFINITY;
    }
    if (r.wrong) {
        ++failures;
        fprintf(stderr, "bench_local: WRONG: seq %d dim %d %s mask %s threads %d %s %s: rel err %.3g\n",
                p->T, p->D, dtype_name(p->dtype), mask_names[p->mask], threads, naive ? "naive" : "ringattn",
                bwd ? "bwd" : "fwd", r.err);
    }
    record(opt, r);
}

static cuda_memory_t cuda_memory;

/* Forward and backward on the CUDA backend: Q, K, V, dO (in the storage dtype) copied to the
   device, O, LSE and the gradients back after the runs for the float64 check. */
static void bench_library_cuda(const options_t *opt, problem_t *p, const reference_t *ref,
                               lib_ctx_t *c) {
    const int half = p->hq != NULL;
    const size_t es = half ? sizeof(uint16_t) : sizeof(float);
    const size_t q = es * (size_t)p->T * p->H * p->D;
    const size_t kv = es * (size_t)p->T * p->HKV * p->D;
    const size_t lse = sizeof(float) * (size_t)p->T * p->H;
    const cuda_memory_t *m = &cuda_memory;
    enum { Q, K, V, O, LSE, DO, DQ, DK, DV, N };
    const void *from[N] = {half ? (void *)p->hq : p->q, half ? (void *)p->hk : p->k,
                           half ? (void *)p->hv : p->v, NULL, NULL,
                           half ? (void *)p->hdout : p->dout, NULL, NULL, NULL};
    void *back_o = half ? (void *)p->ho : p->o, *back_dq = half ? (void *)p->hdq : p->dq;
    void *back_dk = half ? (void *)p->hdk : p->dk, *back_dv = half ? (void *)p->hdv : p->dv;
    const size_t bytes[N] = {q, kv, kv, q, lse, q, q, kv, kv};
    void *d[N];
    int ok = 1;
    for (int i = 0; i < N; ++i) ok &= (d[i] = cuda_memory_upload(m, from[i], bytes[i])) != NULL;
    double fwd = -1.0, bwd = -1.0;
    if (ok) {
        c->cuda = m;
        c->t = (ringattn_tensors_t)RINGATTN_TENSORS_INIT;
        c->t.q.data = d[Q], c->t.k.data = d[K], c->t.v.data = d[V], c->t.o.data = d[O];
        c->t.lse = d[LSE], c->t.dout.data = d[DO];
        c->t.dq.data = d[DQ], c->t.dk.data = d[DK], c->t.dv.data = d[DV];
        fwd = measure(opt, run_lib, c, 0);
        if (fwd >= 0 && (m->copy(back_o, d[O], q, 4) != 0 || m->copy(p->lse, d[LSE], lse, 4) != 0))
            fwd = -1.0;
        outputs_to_f32(p, 0);
        if (fwd >= 0) bwd = measure(opt, run_lib, c, 1);
        if (bwd >= 0 && (m->copy(back_dq, d[DQ], q, 4) || m->copy(back_dk, d[DK], kv, 4) ||
                         m->copy(back_dv, d[DV], kv, 4)))
            bwd = -1.0;
        outputs_to_f32(p, 1);
    } else {
        fprintf(stderr, "bench_local: --backend cuda: device allocation failed\n");
    }
    report(opt, p, ref, 1, 0, 0, fwd);
    if (fwd >= 0) report(opt, p, ref, 1, 0, 1, bwd);
    for (int i = 0; i < N; ++i)
        if (d[i]) m->free_(d[i]);
}

static void bench_library(const options_t *opt, problem_t *p, const reference_t *ref, int threads) {
    const int32_t cu[2] = {0, p->T};
    ringattn_plan_desc_t desc = one_sequence_desc(cu, p->H, p->HKV, p->D, threads);
    if (opt->cuda) desc.backend = RINGATTN_BACKEND_CUDA, desc.num_threads = 0;
    desc.causal = p->mask != MASK_NONE;
    desc.dtype = (ringattn_dtype_t)p->dtype;
    desc.block_q = opt->block_q, desc.block_k = opt->block_k;
    mask_window(p->mask, &desc.window_left, &desc.window_right);
    lib_ctx_t c = {NULL, RINGATTN_TENSORS_INIT, NULL};
    const ringattn_status_t st = ringattn_plan_create(NULL, &desc, &c.plan);
    if (st != RINGATTN_SUCCESS) {
        fprintf(stderr, "bench_local: ringattn_plan_create: %s: %s\n", ringattn_status_string(st),
                ringattn_last_error());
        report(opt, p, ref, threads, 0, 0, -1.0);
        return;
    }
    c.t.q.data = p->q, c.t.k.data = p->k, c.t.v.data = p->v, c.t.o.data = p->o;
    c.t.lse = p->lse, c.t.dout.data = p->dout;
    c.t.dq.data = p->dq, c.t.dk.data = p->dk, c.t.dv.data = p->dv;
    if (p->hq) { /* float16/bfloat16 storage */
        c.t.q.data = p->hq, c.t.k.data = p->hk, c.t.v.data = p->hv, c.t.o.data = p->ho;
        c.t.dout.data = p->hdout, c.t.dq.data = p->hdq, c.t.dk.data = p->hdk, c.t.dv.data = p->hdv;
    }
    if (opt->cuda) {
        bench_library_cuda(opt, p, ref, &c);
    } else {
        const double fwd = measure(opt, run_lib, &c, 0);
        outputs_to_f32(p, 0);
        report(opt, p, ref, threads, 0, 0, fwd);
        if (fwd < 0) goto done;
        const double bwd = measure(opt, run_lib, &c, 1);
        outputs_to_f32(p, 1);
        report(opt, p, ref, threads, 0, 1, bwd);
    }
done:
    ringattn_plan_destroy(c.plan);
}

static void bench_naive(const options_t *opt, problem_t *p, const reference_t *ref) {
    naive_ctx_t c = {p, xmalloc(sizeof(float) * (size_t)p->T)};
    options_t once = *opt;
    once.reps = 1; /* slow by design; one run is enough for a comparison */
    report(opt, p, ref, 1, 1, 0, measure(&once, run_naive, &c, 0));
    report(opt, p, ref, 1, 1, 1, measure(&once, run_naive, &c, 1));
    free(c.s);
}

/* ---------------------------------------------------------------- ratios tracked by the project */

static const result_t *find(int seq, int dim, int mask, int threads, int bwd) {
    for (int i = 0; i < nresults; ++i) {
        const result_t *r = &results[i];
        if (!r->naive && r->dtype == RINGATTN_FLOAT32 && r->seq == seq && r->dim == dim &&
            r->mask == mask && r->threads == threads &&
            r->bwd == bwd && r->time_ms > 0)
            return r;
    }
    return NULL;
}

static void print_ratios(const options_t *opt) {
    int all = 0;
    for (int i = 0; i < opt->nthreads; ++i) all = opt->threads[i] > all ? opt->threads[i] : all;
    printf("# tracked ratios (D = 128, threads = %d):\n", all);
    const char *hint = "not measured";
    for (int bwd = 0; bwd < 2; ++bwd) {
        const result_t *r = find(8192, 128, MASK_NONE, all, bwd);
        const double target = bwd ? 40.0 : 60.0;
        if (r)
            printf("#   %s eff%% at T=8192 no mask: %.1f%% (target >= %.0f%%: %s)\n",
                   bwd ? "backward" : "forward ", r->eff, target, r->eff >= target ? "met" : "MISSED");
        else
            printf("#   %s eff%% at T=8192 no mask: %s (--seq 8192 --dim 128 --mask none)\n",
                   bwd ? "backward" : "forward ", hint);
        json_ratio(json, bwd ? "bwd_eff_pct_T8192_D128_none" : "fwd_eff_pct_T8192_D128_none",
                   r ? r->eff : NAN, target);
    }
    for (int bwd = 0; bwd < 2; ++bwd) {
        const result_t *a = find(32768, 128, MASK_WINDOW, all, bwd), *b = find(8192, 128, MASK_WINDOW, all, bwd);
        const double ratio = a && b ? a->time_ms / b->time_ms : NAN;
        if (a && b)
            printf("#   %s time(T=32768)/time(T=8192), window 1024: %.2f (target <= 4.4%s)\n",
                   bwd ? "backward" : "forward ", ratio,
                   bwd ? ", tracked for the forward" : ratio <= 4.4 ? ": met" : ": MISSED");
        else
            printf("#   %s time(T=32768)/time(T=8192), window 1024: %s (--seq 8192,32768 --mask window)\n",
                   bwd ? "backward" : "forward ", hint);
        json_ratio(json, bwd ? "bwd_time_T32768_over_T8192_win1024" : "fwd_time_T32768_over_T8192_win1024",
                   ratio, 4.4);
    }
}

/* ---------------------------------------------------------------- options */

static void usage(void) {
    printf(
        "usage: bench_local [--seq LIST|all] [--dim LIST] [--mask LIST] [--threads LIST]\n"
        "                   [--heads H] [--kv-heads HKV] [--reps N] [--budget SECONDS]\n"
        "                   [--sample ROWS] [--no-naive] [--quick] [--json FILE] [--no-json]\n"
        "                   [--backend cpu|cuda] [--dtype LIST] [--block Q,K] [--counters]\n"
        "  LIST is comma-separated. --seq from 1024,2048,4096,8192,16384,32768 (any T works);\n"
        "  --dim 64,128; --mask none,causal,window (window = causal sliding window of %d);\n"
        "  --threads 1,all (numbers or 'all' = OpenMP's max threads).\n"
        "  Default: every T, D, mask and both thread counts, except that masks none and\n"
        "  causal stop at T = 8192 (1 thread) and 16384 (more threads) unless --seq is given\n"
        "  (--seq all: everything); best of --reps 3 runs, fewer once\n"
        "  --budget 4 s is spent on one measurement; --sample 16 rows checked against float64.\n"
        "  --quick: T 1024,8192,32768 (32768 window only), D 128, all threads, 1 run (< 1 min).\n"
        "  JSON lines go to stdout after the table, or to FILE with --json FILE.\n"
        "  --backend cuda: the CUDA backend (one device: --threads is ignored).\n"
        "  --dtype f32,f16,bf16 (default f32): the tensors' storage dtype (either backend; the\n"
        "  naive rows and the tracked ratios are float32 only).\n"
        "  --counters: with --backend cuda on the emulated library, its performance counters\n"
        "  (RA_EMU_COUNTERS): a JSON line per kernel launch on stderr, or in RA_EMU_COUNTERS_FILE.\n"
        "  --block Q,K: the plan's query and key tile rows (default: the library's, 256,256).\n",
        WINDOW);
}

static int parse_list(const char *s, int *out, int *n, int (*item)(const char *, int *)) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST || !item(tok, &out[*n])) return 0;
        ++*n;
    }
    return *n > 0;
}

static int parse_int(const char *s, int *v) {
    char *end;
    const long x = strtol(s, &end, 10);
    *v = (int)x;
    return *s && !*end && x > 0 && x <= INT32_MAX;
}

static int parse_mask(const char *s, int *v) {
    for (int m = 0; m < NUM_MASKS; ++m)
        if (!strcmp(s, mask_names[m])) return *v = m, 1;
    if (!strcmp(s, "window")) return *v = MASK_WINDOW, 1;
    return 0;
}

static int parse_dtype(const char *s, int *v) {
    const int all[] = {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16};
    for (int i = 0; i < 3; ++i)
        if (!strcmp(s, dtype_name(all[i]))) return *v = all[i], 1;
    return 0;
}

static int parse_threads(const char *s, int *v) {
    if (!strcmp(s, "all")) return *v = omp_get_max_threads(), 1;
    return parse_int(s, v);
}

static int parse(int argc, char **argv, options_t *o) {
    static const int all_seqs[] = {1024, 2048, 4096, 8192, 16384, 32768};
    memset(o, 0, sizeof *o);
    o->nseqs = 6;
    memcpy(o->seqs, all_seqs, sizeof all_seqs);
    o->ndims = 2, o->dims[0] = 64, o->dims[1] = 128;
    o->nmasks = 3, o->masks[0] = MASK_NONE, o->masks[1] = MASK_CAUSAL, o->masks[2] = MASK_WINDOW;
    o->nthreads = 2, o->threads[0] = 1, o->threads[1] = omp_get_max_threads();
    if (o->threads[1] == 1) o->nthreads = 1;
    o->heads = 2, o->kv_heads = 1, o->reps = 3, o->budget_s = 4.0;
    o->quad_max_seq[0] = 8192, o->quad_max_seq[1] = 16384;
    o->sample = 16, o->naive = 1;
    o->ndtypes = 1, o->dtypes[0] = RINGATTN_FLOAT32;
    int seq_given = 0, dim_given = 0, threads_given = 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); exit(0); }
        else if (!strcmp(a, "--quick")) { o->quick = 1; continue; }
        else if (!strcmp(a, "--no-naive")) { o->naive = 0; continue; }
        else if (!strcmp(a, "--no-json")) { o->no_json = 1; continue; }
        else if (!strcmp(a, "--counters")) { o->counters = 1; continue; }
        if (!v) { fprintf(stderr, "bench_local: %s: missing value or unknown flag\n", a); return 0; }
        ++i;
        if (!strcmp(a, "--seq")) {
            seq_given = 1;
            if (strcmp(v, "all")) ok = parse_list(v, o->seqs, &o->nseqs, parse_int);
        }
        else if (!strcmp(a, "--dim")) dim_given = 1, ok = parse_list(v, o->dims, &o->ndims, parse_int);
        else if (!strcmp(a, "--mask")) ok = parse_list(v, o->masks, &o->nmasks, parse_mask);
        else if (!strcmp(a, "--threads")) threads_given = 1, ok = parse_list(v, o->threads, &o->nthreads, parse_threads);
        else if (!strcmp(a, "--heads")) ok = parse_int(v, &o->heads);
        else if (!strcmp(a, "--kv-heads")) ok = parse_int(v, &o->kv_heads);
        else if (!strcmp(a, "--reps")) ok = parse_int(v, &o->reps);
        else if (!strcmp(a, "--sample")) ok = parse_int(v, &o->sample);
        else if (!strcmp(a, "--budget")) o->budget_s = atof(v);
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--dtype")) ok = parse_list(v, o->dtypes, &o->ndtypes, parse_dtype);
        else if (!strcmp(a, "--block")) ok = sscanf(v, "%d,%d", &o->block_q, &o->block_k) == 2;
        else if (!strcmp(a, "--backend")) ok = v && (!strcmp(v, "cpu") || !strcmp(v, "cuda")), o->cuda = ok && !strcmp(v, "cuda");
        else { fprintf(stderr, "bench_local: unknown flag %s\n", a); return 0; }
        if (!ok) { fprintf(stderr, "bench_local: %s: bad value '%s' (see --help)\n", a, v); return 0; }
    }
    if (o->quick) {
        if (!seq_given) o->nseqs = 3, o->seqs[0] = 1024, o->seqs[1] = 8192, o->seqs[2] = 32768;
        if (!dim_given) o->ndims = 1, o->dims[0] = 128;
        if (!threads_given) o->nthreads = 1, o->threads[0] = omp_get_max_threads();
        o->reps = 1;
        o->quad_max_seq[0] = o->quad_max_seq[1] = 8192;
    }
    if (seq_given) o->quad_max_seq[0] = o->quad_max_seq[1] = 0;
    if (o->counters && !o->cuda) {
        fprintf(stderr, "bench_local: --counters: the emulated CUDA backend's (--backend cuda)\n");
        return 0;
    }
    if (o->heads % o->kv_heads) {
        fprintf(stderr, "bench_local: --heads %d is not a multiple of --kv-heads %d\n", o->heads, o->kv_heads);
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- main */

/* the default sweep leaves out the slowest (quadratic) runs; an explicit --seq keeps them */
static int skipped(const options_t *o, int T, int mask, int threads) {
    const int limit = o->quad_max_seq[threads > 1];
    return mask != MASK_WINDOW && limit && T > limit;
}

int main(int argc, char **argv) {
    options_t opt;
    if (!parse(argc, argv, &opt)) return 2;
    if (!opt.no_json && !(json = json_open(opt.json_path))) return 2;
    const int max_threads = omp_get_max_threads();
    const char *backend = opt.cuda ? "cuda" : "cpu";
    if (opt.cuda) {
        if (cuda_memory_load(&cuda_memory, "bench_local")) return 2;
        opt.nthreads = 1, opt.threads[0] = 1; /* one device */
    }
    if (opt.counters) { /* the emulated library's hook; a GPU has none (ncu counts there) */
        void (*counters)(int) = NULL;
        *(void **)&counters = dlsym(RTLD_DEFAULT, "ra_emu_counters");
        if (!counters) {
            fprintf(stderr, "bench_local: --counters: not the emulated library (on a GPU, ncu)\n");
            return 2;
        }
        counters(1);
    }
    printf("# ringattn %s bench_local: backend %s, ranks 1, threads 1..%d, kv heads %d\n",
           ringattn_version_string(), backend, max_threads, opt.kv_heads);
    if (opt.cuda)
        printf("# backend cuda: device copies of the tensors, each run timed to a device "
               "synchronisation; eff%% 0: no device ceiling\n");
    print_blas("# warning: OpenBLAS chose its %s kernels although this CPU has %s; sgemm (the\n"
               "#   ceiling, and ringattn's float32 tile products unless the CPU kernels line says\n"
               "#   ringattn's) runs 2x or more slower than it can. Set OPENBLAS_CORETYPE=%s.\n");
    const double tile = sgemm_gflops(128, 128, 128, 1, 0.2);
    const double c1 = ceiling_for(1), cn = ceiling_for(max_threads);
    for (int i = 0; i < opt.nthreads; ++i) ceiling_for(opt.threads[i]);
    printf("# sgemm ceiling (2048^3, measured now): 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s\n",
           c1, max_threads, cn);
    printf("# sgemm 128x128x128 (tile-sized), 1 thread: %.1f GFLOP/s\n", tile);
    printf("# GFLOP/s counts allowed pairs only: fwd 4*D, bwd 10*D flop per pair per head; "
           "eff%% = GFLOP/s / sgemm ceiling at the same threads\n");
    if (json) {
        fprintf(json, "{\"type\":\"banner\",\"version\":\"%s\",\"backend\":\"%s\",\"ranks\":1,"
                      "\"max_threads\":%d,\"sgemm_2048_1t_gflops\":%.3f,\"sgemm_2048_all_gflops\":%.3f,"
                      "\"sgemm_128_1t_gflops\":%.3f}\n",
                ringattn_version_string(), backend, max_threads, c1, cn, tile);
    }
    printf("%6s %5s %4s %-5s %-8s %-7s %5s %7s %4s %10s %8s %5s %5s\n", "seq", "heads", "dim",
           "dtype", "mask",
           "layout", "ranks", "threads", "pass", "time_ms", "GFLOP/s", "eff%", "wrong");

    uint64_t seed = 42;
    for (int si = 0; si < opt.nseqs; ++si)
        for (int di = 0; di < opt.ndims * opt.ndtypes; ++di) {
            const int T = opt.seqs[si], D = opt.dims[di / opt.ndtypes];
            const int dt = opt.dtypes[di % opt.ndtypes];
            int any = 0; /* skip the allocation when every run is skipped at this T */
            for (int mi = 0; mi < opt.nmasks; ++mi)
                for (int ti = 0; ti < opt.nthreads; ++ti) any |= !skipped(&opt, T, opt.masks[mi], opt.threads[ti]);
            if (!any) continue;
            problem_t p;
            problem_init(&p, T, opt.heads, opt.kv_heads, D, dt, seed++);
            for (int mi = 0; mi < opt.nmasks; ++mi) {
                p.mask = opt.masks[mi];
                const int naive = opt.naive && T == NAIVE_SEQ && dt == RINGATTN_FLOAT32;
                int runs = naive;
                for (int ti = 0; ti < opt.nthreads; ++ti) runs += !skipped(&opt, T, p.mask, opt.threads[ti]);
                if (!runs) continue;
                reference_t ref;
                reference_init(&ref, &p, opt.sample, seed++);
                if (naive) bench_naive(&opt, &p, &ref);
                for (int ti = 0; ti < opt.nthreads; ++ti)
                    if (!skipped(&opt, T, p.mask, opt.threads[ti])) bench_library(&opt, &p, &ref, opt.threads[ti]);
                reference_free(&ref);
            }
            problem_free(&p);
        }
    print_ratios(&opt);
    json_close(json, opt.json_path); /* the JSON lines after the table, unless --json FILE */
    if (failures) printf("# %d wrong or failed result(s)\n", failures);
    return failures ? 1 : 0;
}
