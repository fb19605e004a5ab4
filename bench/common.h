/*
 * bench/common.h: what the benchmarks (bench_local, bench_dynamic, bench_ring) share, as static
 * inline functions: the clock, allocation, random inputs, the plan descriptor of one sequence,
 * the sampled rows checked against float64 (the rows, the float64 reference of a row over a key
 * range, the forward and dQ errors), the OpenBLAS banner line and the JSON lines.
 *
 * Before including it a benchmark defines BENCH_NAME, its name for messages ("bench_local"), and
 * bench_ring also BENCH_MPI (after <mpi.h>): out of memory then stops every rank.
 */
#ifndef RINGATTN_BENCH_COMMON_H
#define RINGATTN_BENCH_COMMON_H

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name, for messages) before including bench/common.h"
#endif

#ifndef RINGATTN_BENCH_NO_BLAS /* a build without BLAS (bench/CMakeLists.txt) */
#include <cblas.h>
#endif
#include <math.h>
#include <ringattn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- utilities */

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* malloc that does not return NULL: out of memory stops the program (every rank) with status 2 */
static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
#ifdef BENCH_MPI
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        fprintf(stderr, BENCH_NAME ": [rank %d] out of memory (%zu bytes)\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
#else
        fprintf(stderr, BENCH_NAME ": out of memory (%zu bytes)\n", bytes);
        exit(2);
#endif
    }
    return p;
}

static inline uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double unit(uint64_t *s) { /* uniform [0, 1) */
    return (double)(splitmix(s) >> 11) / 9007199254740992.0;
}

static inline float *random_floats(int64_t n, uint64_t *seed) { /* uniform [-1, 1) */
    float *p = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; ++i) p[i] = (float)(unit(seed) * 2.0 - 1.0);
    return p;
}

static inline float *touched_floats(int64_t n) { /* zeros, the pages faulted in before timing */
    float *p = xmalloc(sizeof(float) * (size_t)n);
    memset(p, 0, sizeof(float) * (size_t)n);
    return p;
}

static inline int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* A plan over one sequence of T tokens, no mask yet: cu = {0, T}, which the plan points to (the
   caller keeps it). */
static inline ringattn_plan_desc_t one_sequence_desc(const int32_t cu[2], int H, int HKV, int D,
                                                     int threads) {
    ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.num_seqs = 1;
    d.cu_seqlens = cu;
    d.num_threads = threads;
    return d;
}

/* float32 <-> float16 (dt RINGATTN_FLOAT16) or bfloat16 (else), round to nearest even, NaN kept */
static inline uint16_t half_from_float(float f, int dt) {
    if (dt == RINGATTN_FLOAT16) {
        const _Float16 h = (_Float16)f;
        uint16_t u;
        memcpy(&u, &h, 2);
        return u;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float float_from_half(uint16_t h, int dt) {
    if (dt == RINGATTN_FLOAT16) {
        _Float16 x;
        memcpy(&x, &h, 2);
        return (float)x;
    }
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------------------------------------------------------- float64 reference, sampled rows */

/* Row n of nrows sampled out of T: all of them when nrows == T, else the first, the last, then
   random ones. */
static inline int sample_row(int n, int nrows, int T, uint64_t *seed) {
    return nrows == T ? n : n == 0 ? 0 : n == 1 ? T - 1 : (int)(splitmix(seed) % (uint64_t)T);
}

/* float64 O [D], LSE and dQ [D] of one query row over its allowed keys [lo, hi] (lo <= hi;
   SPEC 2-7 for one row): qi, di its query and dO [D]; k, v the keys and values [T, HKV, D], of
   which kv head hk. */
static inline void reference_row_range(const float *qi, const float *di, const float *k,
                                       const float *v, int HKV, int hk, int D, int64_t lo,
                                       int64_t hi, double *o, double *lse, double *dq) {
    const double scale = 1.0 / sqrt((double)D);
    double *w = xmalloc(sizeof(double) * (size_t)(hi - lo + 1)), m = -INFINITY, l = 0.0, dsum = 0.0;
    double *g = calloc((size_t)D, sizeof(double));
    for (int c = 0; c < D; ++c) o[c] = 0.0;
    for (int64_t j = lo; j <= hi; ++j) {
        const float *kj = k + (j * HKV + hk) * D;
        double d = 0.0;
        for (int c = 0; c < D; ++c) d += (double)qi[c] * kj[c];
        w[j - lo] = d * scale, m = fmax(m, w[j - lo]);
    }
    for (int64_t j = lo; j <= hi; ++j) {
        const float *vj = v + (j * HKV + hk) * D;
        w[j - lo] = exp(w[j - lo] - m), l += w[j - lo];
        for (int c = 0; c < D; ++c) o[c] += w[j - lo] * vj[c];
    }
    for (int c = 0; c < D; ++c) o[c] /= l, dsum += di[c] * o[c];
    *lse = m + log(l);
    for (int64_t j = lo; j <= hi; ++j) { /* SPEC 7 for row i alone */
        const float *kj = k + (j * HKV + hk) * D, *vj = v + (j * HKV + hk) * D;
        double dp = 0.0;
        for (int c = 0; c < D; ++c) dp += (double)di[c] * vj[c];
        const double ds = w[j - lo] / l * (dp - dsum);
        for (int c = 0; c < D; ++c) g[c] += ds * kj[c];
    }
    for (int c = 0; c < D; ++c) dq[c] = scale * g[c];
    free(w), free(g);
}

/* The float64 outputs of the sampled rows of a single-rank run (bench_local, bench_dynamic). */
typedef struct {
    int nrows;
    int *rows;
    double *o, *lse, *dq; /* [nrows][H][D], [nrows][H], [nrows][H][D] (dq: NULL unless with_dq) */
} reference_t;

/* room for min(nrows, T) sampled rows of H heads; rows and values are the caller's to fill */
static inline void reference_alloc(reference_t *r, int nrows, int T, int H, int D, int with_dq) {
    r->nrows = nrows < T ? nrows : T;
    r->rows = xmalloc(sizeof(int) * (size_t)r->nrows);
    r->o = xmalloc(sizeof(double) * (size_t)r->nrows * H * D);
    r->dq = with_dq ? xmalloc(sizeof(double) * (size_t)r->nrows * H * D) : NULL;
    r->lse = xmalloc(sizeof(double) * (size_t)r->nrows * H);
}

static inline void reference_free(reference_t *r) {
    free(r->rows), free(r->o), free(r->lse), free(r->dq);
}

/* forward: max(rel err O, rel err LSE), max-norm relative; INFINITY on any non-finite output.
   o [T, H, D] and lse [H, T]: the run's outputs. */
static inline double forward_error(const reference_t *r, int T, int H, int D, const float *o,
                                   const float *lse) {
    if (!all_finite(o, (int64_t)T * H * D) || !all_finite(lse, (int64_t)T * H)) return INFINITY;
    double eo = 0, ro = 0, el = 0, rl = 0;
    for (int n = 0; n < r->nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const float *on = o + ((int64_t)r->rows[n] * H + h) * D;
            const double *ref = r->o + ((int64_t)n * H + h) * D;
            for (int c = 0; c < D; ++c) eo = fmax(eo, fabs(on[c] - ref[c])), ro = fmax(ro, fabs(ref[c]));
            const double rlse = r->lse[(int64_t)n * H + h];
            el = fmax(el, fabs(lse[(int64_t)h * T + r->rows[n]] - rlse));
            rl = fmax(rl, fabs(rlse));
        }
    return fmax(eo / fmax(ro, 1e-30), el / fmax(rl, 1e-30));
}

/* normwise relative error of dQ [T, H, D] on the sampled rows (finite values assumed) */
static inline double dq_error(const reference_t *r, int H, int D, const float *dq) {
    double e2 = 0, r2 = 0;
    for (int n = 0; n < r->nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const float *g = dq + ((int64_t)r->rows[n] * H + h) * D;
            const double *ref = r->dq + ((int64_t)n * H + h) * D;
            for (int c = 0; c < D; ++c) e2 += (g[c] - ref[c]) * (g[c] - ref[c]), r2 += ref[c] * ref[c];
        }
    return sqrt(e2) / fmax(sqrt(r2), 1e-30);
}

/* ---------------------------------------------------------------- banner and JSON lines */

/* "# CPU kernels: <ringattn's element-wise ISA>", "# BLAS: <config> (kernels: <core>)", then, when OpenBLAS chose generic kernels on a CPU with
   AVX2 or AVX-512, `warning`: a printf format of three %s, the kernels, the CPU's ISA and the
   OPENBLAS_CORETYPE that fits it. */
#ifndef RINGATTN_BENCH_NO_BLAS
static inline void print_blas(const char *warning) {
    const char *core = openblas_get_corename();
    printf("# CPU kernels: %s\n", ringattn_cpu_kernels());
    printf("# BLAS: %s (kernels: %s)\n", openblas_get_config(), core);
    const int generic = !strcmp(core, "Prescott") || !strcmp(core, "Core2") ||
                        !strcmp(core, "Penryn") || !strcmp(core, "Nehalem") || !strcmp(core, "Dunnington");
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
    /* AVX2 kernels on an AVX-512 CPU (forced by OPENBLAS_CORETYPE, or an older OpenBLAS) */
    const int half = avx512 && (!strcmp(core, "Haswell") || !strcmp(core, "Zen"));
    if ((generic && (avx2 || avx512)) || half)
        printf(warning, core, avx512 ? "AVX-512" : "AVX2", avx512 ? "SkylakeX" : "Haswell");
}
#endif

/* JSON lines go to `path`, or (path NULL) to a temporary file that json_close prints after the
   tables. NULL, after perror, when it cannot be opened. */
static inline FILE *json_open(const char *path) {
    FILE *f = path ? fopen(path, "w") : tmpfile();
    if (!f) perror(path ? path : "tmpfile");
    return f;
}

static inline void json_close(FILE *json, const char *path) {
    if (!json) return;
    if (!path) { /* JSON lines after the tables */
        rewind(json);
        char line[2048];
        while (fgets(line, sizeof line, json)) fputs(line, stdout);
    }
    fclose(json);
}

/* a tracked ratio; value NaN: not measured (null) */
static inline void json_ratio(FILE *json, const char *name, double value, double target) {
    if (!json) return;
    char v[32] = "null";
    if (isfinite(value)) snprintf(v, sizeof v, "%.4f", value);
    fprintf(json, "{\"type\":\"ratio\",\"name\":\"%s\",\"value\":%s,\"target\":%g}\n", name, v,
            target);
}

#endif /* RINGATTN_BENCH_COMMON_H */
