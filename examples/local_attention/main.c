/*
 * local_attention: single-rank ringattn on a long packed sequence.
 *
 * Default: T = 32768 tokens as one sequence, 8 query heads on 2 kv heads (GQA), D = 128,
 * causal sliding window of 4096 tokens, float32. Runs the forward and the backward, prints the
 * time and GFLOP/s (counting allowed query-key pairs only), and checks a random sample of rows
 * (all heads) against a float64 computation done here: O and LSE (forward) and dQ (backward).
 * Exits 1 when an error is above the SPEC 9 tolerance, 2 on a usage or API error.
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

/* ---- storage dtypes: float32, float16, bfloat16 (round to nearest even) ---- */

static size_t dtype_size(ringattn_dtype_t dt) { return dt == RINGATTN_FLOAT32 ? 4 : 2; }
static const char *dtype_name(ringattn_dtype_t dt) {
    return dt == RINGATTN_FLOAT32 ? "float32" : dt == RINGATTN_FLOAT16 ? "float16" : "bfloat16";
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

/* ---- inputs ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
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
    float *f = malloc(sizeof(float) * (size_t)elems);
    if (!f) {
        fprintf(stderr, "out of memory (%lld elements)\n", (long long)elems);
        exit(2);
    }
    for (int64_t i = 0; i < elems; ++i) f[i] = load(buf, dt, i);
    return f;
}

static void release_float(const float *f, const void *buf) {
    if ((const void *)f != buf) free((void *)f);
}

static void *random_tensor(int64_t elems, ringattn_dtype_t dt, uint64_t *seed) {
    void *p = alloc_tensor(elems, dt);
    for (int64_t i = 0; i < elems; ++i) store(p, dt, i, uniform(seed));
    return p;
}

/* ---- masks (SPEC 3, delta = 0) ---- */

typedef struct {
    int64_t lo, hi; /* allowed keys of a row: [lo, hi], global token indices */
} range_t;

static void window_of(const options_t *o, int *wl, int *wr) {
    *wl = o->window > 0 ? o->window - 1 : -1;
    *wr = o->causal ? 0 : (o->window > 0 ? o->window - 1 : -1);
}

static range_t allowed_keys(const options_t *o, const int32_t *cu, int64_t t) {
    int s = 0;
    while (cu[s + 1] <= t) ++s;
    int wl, wr;
    window_of(o, &wl, &wr);
    range_t r = {cu[s], cu[s + 1] - 1};
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

/* ---- reference for one row and head: float64 (oracle) or float32 (plain implementation) ---- */

typedef struct {
    const options_t *opt;
    const float *q, *k, *v, *dout; /* the stored inputs as float32 (exact for every dtype) */
    const int32_t *cu;
} inputs_t;

#define DEFINE_ROW_REFERENCE(NAME, REAL, EXP, LOG, ROUND)                                     \
    static void NAME(const inputs_t *in, int64_t t, int h, double *o, double *lse,             \
                     double *dq) {                                                             \
        const options_t *op = in->opt;                                                         \
        const int D = op->dim, hk = h / (op->heads / op->kv_heads);                           \
        const ringattn_dtype_t dt = op->dtype;                                                 \
        const REAL scale = (REAL)(1.0 / sqrt((double)D));                                      \
        const range_t r = allowed_keys(op, in->cu, t);                                         \
        const int64_t nk = r.hi >= r.lo ? r.hi - r.lo + 1 : 0;                                 \
        const float *qi = in->q + (t * op->heads + h) * D;                                     \
        const float *di = in->dout ? in->dout + (t * op->heads + h) * D : NULL;                \
        REAL *s = malloc(sizeof(REAL) * (size_t)(nk + 1));                                     \
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

/* ---- checks on a sample of rows ---- */

typedef struct {
    double o_err, o_ref, lse_err, lse_ref, dq_err2, dq_ref2; /* maxima / sums of squares */
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

/* rows: sample; lib: the library's O/LSE/dQ; fills errors of the library and of the plain
   float32 implementation, both against the float64 reference */
static void check_rows(const inputs_t *in, const int64_t *rows, int nrows, const void *o,
                       const float *lse, const void *dq, errors_t *lib, errors_t *plain) {
    const options_t *op = in->opt;
    const int D = op->dim;
    double *buf = malloc(sizeof(double) * (size_t)D * 6);
    double *ro = buf, *rdq = buf + D, *po = buf + 2 * D, *pdq = buf + 3 * D, *lo = buf + 4 * D,
           *ldq = buf + 5 * D;
    for (int n = 0; n < nrows; ++n)
        for (int h = 0; h < op->heads; ++h) {
            const int64_t t = rows[n];
            double rlse, plse;
            reference_f64(in, t, h, ro, &rlse, rdq);
            plain_f32(in, t, h, po, &plse, pdq);
            for (int c = 0; c < D; ++c) {
                const int64_t i = (t * op->heads + h) * D + c;
                lo[c] = load(o, op->dtype, i);
                if (dq) ldq[c] = load(dq, op->dtype, i);
            }
            accumulate(lib, lo, ro, lse[(int64_t)h * op->seq + t], rlse, dq ? ldq : NULL, rdq, D);
            accumulate(plain, po, ro, plse, rlse, dq ? pdq : NULL, rdq, D);
        }
    free(buf);
}

/* SPEC 9: float32 within fixed relative bounds; float16/bfloat16 at most 2x the error of the
   plain same-precision implementation (never below the float32 bound, which LSE, always
   float32, would otherwise have to beat) */
static int verdict(const char *what, double err, double plain_err, double f32_tol,
                   ringattn_dtype_t dt) {
    const double tol = dt == RINGATTN_FLOAT32 ? f32_tol : fmax(2.0 * plain_err, f32_tol);
    const int ok = err <= tol;
    printf("  %-4s rel error %.3g (plain %s implementation %.3g), tolerance %.3g: %s\n", what,
           err, dtype_name(dt), plain_err, tol, ok ? "ok" : "FAILED");
    return ok;
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
            if (!strcmp(v, "f32") || !strcmp(v, "float32")) o->dtype = RINGATTN_FLOAT32;
            else if (!strcmp(v, "f16") || !strcmp(v, "float16")) o->dtype = RINGATTN_FLOAT16;
            else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) o->dtype = RINGATTN_BFLOAT16;
            else { fprintf(stderr, "--dtype: got %s, expected f32, f16 or bf16\n", v); return 0; }
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
    cu[0] = 0;
    for (int s = 0; s < opt.num_seqs; ++s)
        cu[s + 1] = cu[s] + (int32_t)(T / opt.num_seqs + (s < T % opt.num_seqs));

    int wl, wr;
    window_of(&opt, &wl, &wr);
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

    const double pairs = allowed_pairs(&opt, cu) * H; /* allowed (query, key) pairs, all heads */
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
    for (int n = 0; n < nrows; ++n)
        rows[n] = nrows == T ? n
                  : n == 0   ? 0
                  : n == 1   ? T - 1
                             : (int64_t)(splitmix(&seed) % (uint64_t)T);
    t0 = now();
    const float *qf = as_float(q, T * H * D, dt), *kf = as_float(k, T * HKV * D, dt);
    const float *vf = as_float(v, T * HKV * D, dt);
    const float *df = opt.backward ? as_float(dout, T * H * D, dt) : NULL;
    const inputs_t in = {&opt, qf, kf, vf, df, cu};
    errors_t lib = {0}, plain = {0};
    check_rows(&in, rows, nrows, o, lse, opt.backward ? dq : NULL, &lib, &plain);
    release_float(qf, q), release_float(kf, k), release_float(vf, v);
    if (df) release_float(df, dout);
    printf("check of %d rows x %d heads against float64 (%.1f s):\n", nrows, H, now() - t0);
    int ok = verdict("O", rel(lib.o_err, lib.o_ref), rel(plain.o_err, plain.o_ref), 1e-5, dt);
    ok &= verdict("LSE", rel(lib.lse_err, lib.lse_ref), rel(plain.lse_err, plain.lse_ref), 1e-5, dt);
    if (opt.backward)
        ok &= verdict("dQ", rel(sqrt(lib.dq_err2), sqrt(lib.dq_ref2)),
                      rel(sqrt(plain.dq_err2), sqrt(plain.dq_ref2)), 1e-4, dt);
    printf("%s\n", ok ? "ok" : "FAILED: error above the SPEC 9 tolerance");

    free(rows), free(cu), free(q), free(k), free(v), free(dout), free(o), free(lse);
    free(dq), free(dk), free(dv);
    return ok ? 0 : 1;
}
