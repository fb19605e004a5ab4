/*
 * local_attention: single-rank ringattn on a long packed sequence.
 *
 * Default: T = 32768 tokens as one sequence, 8 query heads on 2 kv heads (GQA), D = 128,
 * causal sliding window of 4096 tokens, float32. Runs the forward and the backward, prints the
 * time and GFLOP/s (counting allowed query-key pairs only), and checks a random sample of rows
 * (all heads) against a float64 computation done here: O and LSE (forward) and dQ (backward).
 * Exits 1 when an error is above the SPEC 9 tolerance, 2 on a usage or API error. The helpers
 * it shares with the other examples (float16/bfloat16 storage, random inputs, the mask, the
 * float64 reference) are in ../common/example_util.h.
 *
 *   local_attention [--seq T] [--seqs N] [--heads H] [--kv-heads HKV] [--dim D]
 *                   [--window W] [--no-causal] [--dtype f32|f16|bf16] [--threads N]
 *                   [--sample ROWS] [--seed S] [--no-backward]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <ringattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/example_util.h" /* float16/bfloat16, inputs, mask, float64 reference */

typedef struct {
    int64_t seq;     /* total tokens */
    int num_seqs;    /* packed sequences of (nearly) equal length */
    int heads, kv_heads, dim;
    int window;      /* W tokens (window_left = W - 1); 0 = none */
    int causal;
    ringattn_dtype_t dtype;
    int threads;     /* 0 = OpenMP default */
    int sample;
    uint64_t seed;
    int backward;
} options_t;

/* ---- inputs ---- */

static void *xmalloc(size_t bytes) { /* example_util.h asks for it: out of memory exits (2) */
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static void *alloc_tensor(int64_t elems, ringattn_dtype_t dt) {
    void *p = malloc((size_t)elems * dtype_size(dt));
    if (!p) {
        fprintf(stderr, "out of memory (%lld elements)\n", (long long)elems);
        exit(2);
    }
    return p;
}

/* the stored values as float32: the buffer itself for float32, a decoded copy otherwise */
static const float *as_float(const void *buf, int64_t elems, ringattn_dtype_t dt) {
    if (dt == RINGATTN_FLOAT32) return buf;
    float *f = alloc_tensor(elems, RINGATTN_FLOAT32);
    for (int64_t i = 0; i < elems; ++i) f[i] = load(buf, dt, i);
    return f;
}

static void release_float(const float *f, const void *buf) {
    if ((const void *)f != buf) free((void *)f);
}

static void *random_tensor(int64_t elems, ringattn_dtype_t dt, uint64_t *seed) {
    void *p = alloc_tensor(elems, dt);
    for (int64_t i = 0; i < elems; ++i) store(p, dt, i, (float)uniform(seed));
    return p;
}

/* ---- mask (SPEC 3, delta = 0) ---- */

static void window_of(const options_t *o, int *wl, int *wr) {
    *wl = o->window > 0 ? o->window - 1 : -1;
    *wr = o->causal ? 0 : (o->window > 0 ? o->window - 1 : -1);
}

/* ---- checks on a sample of rows ---- */

/* rows: sample; qf, df: Q and dO as float32 (df NULL: forward only); o, lse, dq: the library's
   outputs. Fills the errors of the library and of the plain float32 implementation, both
   against the float64 reference (example_util.h). */
static void check_rows(const reference_inputs_t *in, const float *qf, const float *df,
                       const int64_t *rows, int nrows, const void *o, const float *lse,
                       const void *dq, errors_t *lib, errors_t *plain) {
    const int D = in->dim, H = in->heads;
    const int64_t T = in->mask.cu[in->mask.num_seqs];
    double *buf = xmalloc(sizeof(double) * (size_t)D * 6);
    double *ro = buf, *rdq = buf + D, *po = buf + 2 * D, *pdq = buf + 3 * D, *lo = buf + 4 * D,
           *ldq = buf + 5 * D;
    for (int n = 0; n < nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const int64_t t = rows[n], at = (t * H + h) * D;
            const float *di = df ? df + at : NULL;
            double rlse, plse;
            reference_f64(in, t, h, qf + at, di, ro, &rlse, rdq);
            plain_f32(in, t, h, qf + at, di, po, &plse, pdq);
            for (int c = 0; c < D; ++c) {
                lo[c] = load(o, in->dtype, at + c);
                if (dq) ldq[c] = load(dq, in->dtype, at + c);
            }
            accumulate(lib, lo, ro, lse[(int64_t)h * T + t], rlse, dq ? ldq : NULL, rdq, D);
            accumulate(plain, po, ro, plse, rlse, dq ? pdq : NULL, rdq, D);
        }
    free(buf);
}

/* ---- main ---- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(const char *argv0) {
    printf("usage: %s [--seq T] [--seqs N] [--heads H] [--kv-heads HKV] [--dim D]\n"
           "          [--window W] [--no-causal] [--dtype f32|f16|bf16] [--threads N]\n"
           "          [--sample ROWS] [--seed S] [--no-backward]\n"
           "defaults: --seq 32768 --seqs 1 --heads 8 --kv-heads 2 --dim 128 --window 4096\n"
           "          (causal; window 0 = none) --dtype f32 --threads 0 (OpenMP default)\n"
           "          --sample 64\n",
           argv0);
}

static int parse(int argc, char **argv, options_t *o) {
    *o = (options_t){32768, 1, 8, 2, 128, 4096, 1, RINGATTN_FLOAT32, 0, 64, 1234, 1};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-causal")) { o->causal = 0; continue; }
        if (!strcmp(a, "--no-backward")) { o->backward = 0; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(argv[0]); exit(0); }
        if (!v) { fprintf(stderr, "%s: missing value or unknown flag\n", a); return 0; }
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
        else if (!strcmp(a, "--dtype")) {
            if (!parse_dtype(v, &o->dtype)) {
                fprintf(stderr, "--dtype: got %s, expected f32, f16 or bf16\n", v);
                return 0;
            }
        } else { fprintf(stderr, "unknown flag %s\n", a); return 0; }
    }
    if (o->seq < 1 || o->seq > INT32_MAX || o->num_seqs < 1 || o->num_seqs > o->seq ||
        o->heads < 1 || o->kv_heads < 1 || o->heads % o->kv_heads || o->dim < 1 ||
        o->window < 0 || o->sample < 1 || o->threads < 0) {
        fprintf(stderr, "invalid options (heads must be a multiple of kv-heads; see --help)\n");
        return 0;
    }
    return 1;
}

static int api_failed(const char *fn, ringattn_status_t st) {
    if (st == RINGATTN_SUCCESS) return 0;
    fprintf(stderr, "%s: %s: %s\n", fn, ringattn_status_string(st), ringattn_last_error());
    return 1;
}

int main(int argc, char **argv) {
    options_t opt;
    if (!parse(argc, argv, &opt)) return 2;
    const int64_t T = opt.seq;
    const int H = opt.heads, HKV = opt.kv_heads, D = opt.dim;
    const ringattn_dtype_t dt = opt.dtype;

    /* num_seqs sequences, the first T % num_seqs one token longer (SPEC 8 convention) */
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(opt.num_seqs + 1));
    split_tokens(T, opt.num_seqs, cu);

    int wl, wr;
    window_of(&opt, &wl, &wr);
    const mask_t mask = {cu, opt.num_seqs, wl, wr};
    printf("ringattn %s local attention (1 rank, cpu)\n", ringattn_version_string());
    printf("  tokens %lld in %d sequence(s), heads %d, kv heads %d, head dim %d, %s\n",
           (long long)T, opt.num_seqs, H, HKV, D, dtype_name(dt));
    char threads[32] = "OpenMP default";
    if (opt.threads) snprintf(threads, sizeof threads, "%d", opt.threads);
    printf("  mask: %s, window (%d, %d), threads %s\n", opt.causal ? "causal" : "bidirectional",
           wl, wr, threads);

    uint64_t seed = opt.seed;
    void *q = random_tensor(T * H * D, dt, &seed);
    void *k = random_tensor(T * HKV * D, dt, &seed);
    void *v = random_tensor(T * HKV * D, dt, &seed);
    void *dout = random_tensor(T * H * D, dt, &seed);
    void *o = alloc_tensor(T * H * D, dt);
    float *lse = malloc(sizeof(float) * (size_t)(T * H));
    void *dq = alloc_tensor(T * H * D, dt), *dk = alloc_tensor(T * HKV * D, dt);
    void *dv = alloc_tensor(T * HKV * D, dt);

    ringattn_plan_desc_t desc = RINGATTN_PLAN_DESC_INIT;
    desc.num_heads = H;
    desc.num_kv_heads = HKV;
    desc.head_dim = D;
    desc.dtype = dt;
    desc.num_seqs = opt.num_seqs;
    desc.cu_seqlens = cu;
    desc.causal = opt.causal;
    desc.window_left = wl;
    desc.window_right = opt.causal ? -1 : wr;
    desc.num_threads = opt.threads;

    ringattn_plan_t plan = NULL;
    double t0 = now();
    if (api_failed("ringattn_plan_create", ringattn_plan_create(NULL, &desc, &plan))) return 2;
    printf("  plan created in %.1f ms\n", 1e3 * (now() - t0));

    ringattn_tensors_t ts = RINGATTN_TENSORS_INIT;
    ts.q.data = q, ts.k.data = k, ts.v.data = v, ts.o.data = o, ts.lse = lse;
    ts.dout.data = dout, ts.dq.data = dq, ts.dk.data = dk, ts.dv.data = dv;

    const double pairs = allowed_pairs(&mask) * H; /* allowed (query, key) pairs, all heads */
    const double fwd_flop = pairs * 4.0 * D, bwd_flop = 2.5 * fwd_flop;
    printf("  allowed pairs %.4g (%.2f%% of T^2 x heads)\n", pairs,
           100.0 * pairs / ((double)T * (double)T * H));

    t0 = now();
    if (api_failed("ringattn_forward", ringattn_forward(plan, &ts, NULL))) return 2;
    const double fwd_s = now() - t0;
    printf("forward:  %9.1f ms  %7.1f GFLOP/s\n", 1e3 * fwd_s, fwd_flop / fwd_s * 1e-9);

    double bwd_s = 0.0;
    if (opt.backward) {
        t0 = now();
        if (api_failed("ringattn_backward", ringattn_backward(plan, &ts, NULL))) return 2;
        bwd_s = now() - t0;
        printf("backward: %9.1f ms  %7.1f GFLOP/s\n", 1e3 * bwd_s, bwd_flop / bwd_s * 1e-9);
    }
    ringattn_plan_destroy(plan);

    /* sample: first, last and random rows (all heads) */
    const int nrows = opt.sample < T ? opt.sample : (int)T;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)nrows);
    sample_rows(rows, nrows, T, &seed);
    t0 = now();
    const float *qf = as_float(q, T * H * D, dt), *kf = as_float(k, T * HKV * D, dt);
    const float *vf = as_float(v, T * HKV * D, dt);
    const float *df = opt.backward ? as_float(dout, T * H * D, dt) : NULL;
    const reference_inputs_t in = {H, HKV, D, dt, mask, kf, vf};
    errors_t lib = {0}, plain = {0};
    check_rows(&in, qf, df, rows, nrows, o, lse, opt.backward ? dq : NULL, &lib, &plain);
    release_float(qf, q), release_float(kf, k), release_float(vf, v);
    if (df) release_float(df, dout);
    printf("check of %d rows x %d heads against float64 (%.1f s):\n", nrows, H, now() - t0);
    int ok = spec9_verdict("O", rel(lib.o_err, lib.o_ref), rel(plain.o_err, plain.o_ref), 1e-5,
                           dt, 1);
    ok &= spec9_verdict("LSE", rel(lib.lse_err, lib.lse_ref), rel(plain.lse_err, plain.lse_ref),
                        1e-5, dt, 1);
    if (opt.backward)
        ok &= spec9_verdict("dQ", rel(sqrt(lib.dq_err2), sqrt(lib.dq_ref2)),
                            rel(sqrt(plain.dq_err2), sqrt(plain.dq_ref2)), 1e-4, dt, 1);
    printf("%s\n", ok ? "ok" : "FAILED: error above the SPEC 9 tolerance");

    free(rows), free(cu), free(q), free(k), free(v), free(dout), free(o), free(lse);
    free(dq), free(dk), free(dv);
    return ok ? 0 : 1;
}
