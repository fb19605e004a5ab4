/*
 * example_util.h: what the examples (local_attention, ring_attention, dynamic_mask) share, as
 * static inline functions, so that an example is its main.c plus this header (and, for the MPI
 * examples, example_mpi.h next to it):
 *
 *   - float32 / float16 / bfloat16 storage: conversions (round to nearest even), load, store;
 *   - dtype and layout names, and the parsers of --dtype and --layout;
 *   - random inputs (splitmix64) and the sample of rows an example checks;
 *   - the SPEC 3 mask of a packed batch in which Q and K are the same tokens (delta = 0);
 *   - the float64 reference of one query row (and the plain float32 implementation that SPEC 9
 *     measures 16-bit dtypes against), the errors against it and the SPEC 9 verdict.
 *
 * A program that includes it defines xmalloc (declared below): how it stops when memory runs
 * out. local_attention exits; example_mpi.h defines it for the MPI examples (every rank stops).
 */
#ifndef RINGATTN_EXAMPLE_UTIL_H
#define RINGATTN_EXAMPLE_UTIL_H

#include <ringattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* malloc that does not return NULL: out of memory stops the program with status 2 */
static void *xmalloc(size_t bytes);

/* ---- storage dtypes: float32, float16, bfloat16 (round to nearest even) ---- */

static inline size_t dtype_size(ringattn_dtype_t dt) { return dt == RINGATTN_FLOAT32 ? 4 : 2; }

static inline const char *dtype_name(ringattn_dtype_t dt) {
    return dt == RINGATTN_FLOAT32 ? "float32" : dt == RINGATTN_FLOAT16 ? "float16" : "bfloat16";
}

static inline uint16_t f32_to_f16(float f) {
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

static inline float f16_to_f32(uint16_t h) {
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

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* element i of a tensor stored as dt, as float32 (exact for every dtype) */
static inline float load(const void *buf, ringattn_dtype_t dt, int64_t i) {
    if (dt == RINGATTN_FLOAT32) return ((const float *)buf)[i];
    const uint16_t h = ((const uint16_t *)buf)[i];
    return dt == RINGATTN_FLOAT16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static inline void store(void *buf, ringattn_dtype_t dt, int64_t i, float f) {
    if (dt == RINGATTN_FLOAT32)
        ((float *)buf)[i] = f;
    else
        ((uint16_t *)buf)[i] = dt == RINGATTN_FLOAT16 ? f32_to_f16(f) : f32_to_bf16(f);
}

/* value rounded through the storage dtype, as a same-precision implementation would store it */
static inline float round_dtype(ringattn_dtype_t dt, float f) {
    if (dt == RINGATTN_FLOAT32) return f;
    return dt == RINGATTN_FLOAT16 ? f16_to_f32(f32_to_f16(f)) : bf16_to_f32(f32_to_bf16(f));
}

/* ---- names and flags ---- */

static inline const char *layout_name(ringattn_layout_t l) {
    return l == RINGATTN_LAYOUT_CONTIGUOUS ? "contiguous"
           : l == RINGATTN_LAYOUT_ZIGZAG   ? "zigzag"
                                           : "striped";
}

/* --layout contiguous (or contig) | zigzag | striped; 0 for anything else */
static inline int parse_layout(const char *v, ringattn_layout_t *l) {
    if (!strcmp(v, "contiguous") || !strcmp(v, "contig")) *l = RINGATTN_LAYOUT_CONTIGUOUS;
    else if (!strcmp(v, "zigzag")) *l = RINGATTN_LAYOUT_ZIGZAG;
    else if (!strcmp(v, "striped")) *l = RINGATTN_LAYOUT_STRIPED;
    else return 0;
    return 1;
}

/* --dtype f32 | f16 | bf16 (or float32, float16, bfloat16); 0 for anything else */
static inline int parse_dtype(const char *v, ringattn_dtype_t *dt) {
    if (!strcmp(v, "f32") || !strcmp(v, "float32")) *dt = RINGATTN_FLOAT32;
    else if (!strcmp(v, "f16") || !strcmp(v, "float16")) *dt = RINGATTN_FLOAT16;
    else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) *dt = RINGATTN_BFLOAT16;
    else return 0;
    return 1;
}

/* ---- inputs ---- */

static inline uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double uniform(uint64_t *s) { /* [-1, 1) */
    return (double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* cu [num_seqs + 1]: T tokens as num_seqs sequences, the first T % num_seqs one token longer
   (SPEC 8 convention) */
static inline void split_tokens(int64_t T, int num_seqs, int32_t *cu) {
    cu[0] = 0;
    for (int s = 0; s < num_seqs; ++s)
        cu[s + 1] = cu[s] + (int32_t)(T / num_seqs + (s < T % num_seqs));
}

/* rows [nrows] of `count` to check: all of them when nrows == count, else the first, the last
   and random ones (nrows <= count) */
static inline void sample_rows(int64_t *rows, int nrows, int64_t count, uint64_t *seed) {
    for (int n = 0; n < nrows; ++n)
        rows[n] = nrows == count ? n
                  : n == 0       ? 0
                  : n == 1       ? count - 1
                                 : (int64_t)(splitmix(seed) % (uint64_t)count);
}

/* ---- masks (SPEC 3; Q and K are the same tokens, delta = 0) ---- */

typedef struct {
    const int32_t *cu; /* [num_seqs + 1] sequence boundaries, global token indices */
    int num_seqs;
    int wl, wr;        /* window_left, window_right; -1 = unbounded (causal: wr = 0) */
} mask_t;

typedef struct {
    int64_t lo, hi; /* allowed keys of a row: [lo, hi], global token indices; empty if hi < lo */
} range_t;

/* --window of the ring examples: > 0 a causal sliding window of W tokens, 0 causal, -1 none */
static inline void causal_window(int window, int *wl, int *wr) {
    *wl = window > 0 ? window - 1 : -1;
    *wr = window >= 0 ? 0 : -1;
}

/* the sequence s with cu[s] <= t < cu[s + 1] */
static inline int seq_of(const mask_t *m, int64_t t) {
    int a = 0, b = m->num_seqs - 1;
    while (a < b) {
        const int mid = (a + b + 1) / 2;
        if (m->cu[mid] <= t) a = mid; else b = mid - 1;
    }
    return a;
}

static inline range_t allowed_keys(const mask_t *m, int64_t t) {
    const int s = seq_of(m, t);
    range_t r = {m->cu[s], m->cu[s + 1] - 1};
    if (m->wl >= 0 && t - m->wl > r.lo) r.lo = t - m->wl;
    if (m->wr >= 0 && t + m->wr < r.hi) r.hi = t + m->wr;
    return r;
}

/* allowed (query, key) pairs of one head over every row of the batch */
static inline double allowed_pairs(const mask_t *m) {
    double n = 0.0;
    for (int64_t t = 0; t < m->cu[m->num_seqs]; ++t) {
        const range_t r = allowed_keys(m, t);
        if (r.hi >= r.lo) n += (double)(r.hi - r.lo + 1);
    }
    return n;
}

/* ---- reference for one row and head: float64 (oracle) or float32 (plain implementation) ---- */

typedef struct {
    int heads, kv_heads, dim;
    ringattn_dtype_t dtype; /* storage dtype: the plain implementation rounds O and dQ to it */
    mask_t mask;
    const float *k, *v;     /* global K and V [T, kv_heads, dim] as float32 (exact for every dtype) */
} reference_inputs_t;

/* NAME(in, t, h, qi, di, o, lse, dq): O [dim] and LSE of row t (global index), head h, and with
   di != NULL its dQ [dim]; qi, di: the row's query and dO as float32. */
#define DEFINE_ROW_REFERENCE(NAME, REAL, EXP, LOG, ROUND)                                     \
    static inline void NAME(const reference_inputs_t *in, int64_t t, int h, const float *qi,   \
                            const float *di, double *o, double *lse, double *dq) {             \
        const int D = in->dim, HKV = in->kv_heads, hk = h / (in->heads / HKV);                \
        const ringattn_dtype_t dt = in->dtype;                                                 \
        const REAL scale = (REAL)(1.0 / sqrt((double)D));                                      \
        const range_t r = allowed_keys(&in->mask, t);                                          \
        const int64_t nk = r.hi >= r.lo ? r.hi - r.lo + 1 : 0;                                 \
        REAL *s = xmalloc(sizeof(REAL) * (size_t)(nk + 1));                                    \
        REAL *acc = calloc((size_t)D, sizeof(REAL)), *g = calloc((size_t)D, sizeof(REAL));     \
        REAL m = -INFINITY, l = 0;                                                             \
        for (int64_t j = 0; j < nk; ++j) {                                                     \
            const float *kj = in->k + ((r.lo + j) * HKV + hk) * D;                             \
            REAL d = 0;                                                                        \
            for (int c = 0; c < D; ++c) d += (REAL)qi[c] * (REAL)kj[c];                        \
            s[j] = d * scale;                                                                  \
            if (s[j] > m) m = s[j];                                                            \
        }                                                                                      \
        for (int64_t j = 0; j < nk; ++j) {                                                     \
            const float *vj = in->v + ((r.lo + j) * HKV + hk) * D;                             \
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
                const float *kj = in->k + ((r.lo + j) * HKV + hk) * D;                         \
                const float *vj = in->v + ((r.lo + j) * HKV + hk) * D;                         \
                REAL dp = 0;                                                                   \
                for (int c = 0; c < D; ++c) dp += (REAL)di[c] * (REAL)vj[c];                   \
                const REAL ds = s[j] / l * (dp - dsum);                                        \
                for (int c = 0; c < D; ++c) g[c] += ds * (REAL)kj[c];                          \
            }                                                                                  \
            for (int c = 0; c < D; ++c) dq[c] = (double)ROUND(dt, scale * g[c]);               \
        }                                                                                      \
        free(s), free(acc), free(g);                                                           \
    }

static inline double keep_double(ringattn_dtype_t dt, double x) { (void)dt; return x; }
DEFINE_ROW_REFERENCE(reference_f64, double, exp, log, keep_double)
DEFINE_ROW_REFERENCE(plain_f32, float, expf, logf, round_dtype)

/* ---- errors against the reference ---- */

typedef struct { /* maxima, then sums of squares (example_mpi.h reduces them over ranks) */
    double o_err, o_ref, lse_err, lse_ref;
    double dq_err2, dq_ref2;
} errors_t;

/* adds one row and head: O [D] and LSE (max-norm), dQ [D] when dq != NULL (normwise); ro, rlse,
   rdq: the float64 reference */
static inline void accumulate(errors_t *e, const double *o, const double *ro, double lse,
                              double rlse, const double *dq, const double *rdq, int D) {
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

static inline double rel(double err, double ref) {
    return err == 0.0 ? 0.0 : err / fmax(ref, 1e-30);
}

/* SPEC 9: float32 within fixed relative bounds; float16/bfloat16 at most 2x the error of the
   plain same-precision implementation (never below the float32 bound, which LSE, always
   float32, would otherwise have to beat). Prints the line when `print` is set. */
static inline int spec9_verdict(const char *what, double err, double plain_err, double f32_tol,
                                ringattn_dtype_t dt, int print) {
    const double tol = dt == RINGATTN_FLOAT32 ? f32_tol : fmax(2.0 * plain_err, f32_tol);
    const int ok = err <= tol;
    if (print)
        printf("  %-4s rel error %.3g (plain %s implementation %.3g), tolerance %.3g: %s\n", what,
               err, dtype_name(dt), plain_err, tol, ok ? "ok" : "FAILED");
    return ok;
}

#endif /* RINGATTN_EXAMPLE_UTIL_H */
