/* The CPU backend's tile products: BLAS sgemm or the library's own kernels (bf16_gemm.c,
   f32_gemm.c), and which one runs; OpenBLAS's threads and kernel choice. A build without BLAS
   (RINGATTN_WITH_BLAS=OFF) takes the own kernels wherever the CPU runs them, else plain loops. */
#ifdef RINGATTN_HAVE_BLAS
#include <cblas.h>
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "base/log.h"

/*
 * OpenBLAS built with pthreads would start its own threads inside every tile product of our
 * OpenMP threads; tiles are small, so run BLAS single-threaded while a pass runs.
 */
#ifdef OPENBLAS_VERSION
void ra__cpu_blas_single_thread_begin(int *saved)
{
    *saved = openblas_get_num_threads();
    if (*saved != 1) openblas_set_num_threads(1);
}
void ra__cpu_blas_single_thread_end(int saved)
{
    if (saved != 1) openblas_set_num_threads(saved);
}

/* OpenBLAS may run kernels below the CPU's ISA: older builds fall back to the SSE3 "Prescott"
   kernels on CPUs they do not recognise (4x slower than an AVX2 CPU can do), and
   OPENBLAS_CORETYPE can force older ones (Haswell on an AVX-512 CPU: 2x slower). On AVX-512
   CPUs the library's own float32 kernels then take the tile products (ra__cpu_f32_products);
   elsewhere say once what to set. */
static void check_kernel(void)
{
    const char *core = openblas_get_corename();
#if defined(__x86_64__) && defined(__GNUC__)
    const int avx512 = ra__gemm_f32_supported();
    const int sse = core && (strcmp(core, "Prescott") == 0 || strcmp(core, "Core2") == 0);
    const int avx2 = core && (strcmp(core, "Haswell") == 0 || strcmp(core, "Zen") == 0);
    if (ra__cpu_f32_products())
        ra__log(RA_LOG_INFO, RA_SUB_KERNELS, -1, 0,
                "OpenBLAS uses its %s kernels on a CPU with AVX-512: ringattn's own AVX-512 "
                "kernels take the float32 tile products",
                core);
    else if ((sse && __builtin_cpu_supports("avx2")) || ((sse || avx2) && avx512))
        ra__log(RA_LOG_WARN, RA_SUB_KERNELS, -1, 0,
                "OpenBLAS uses its %s kernels on a CPU with %s; float32 tile products run %s "
                "slower than they could (set OPENBLAS_CORETYPE=%s)",
                core, avx512 ? "AVX-512" : "AVX2", sse ? "several times" : "about 2x",
                avx512 ? "SkylakeX" : "Haswell");
#else
    (void)core;
#endif
}
#else
void ra__cpu_blas_single_thread_begin(int *saved) { *saved = 1; }
void ra__cpu_blas_single_thread_end(int saved) { (void)saved; }
static void check_kernel(void) {}
#endif

void ra__cpu_blas_check(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, check_kernel);
}

#ifndef RINGATTN_HAVE_BLAS
/* C = alpha op(A) op(B) + beta C, row-major, in plain loops (no BLAS in this build). */
static void plain_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc)
{
    for (int i = 0; i < M; ++i) {
        float *c = C + i * ldc;
        for (int j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int k = 0; k < K; ++k) {
            const float a = alpha * (trans_a ? A[k * lda + i] : A[i * lda + k]);
            if (trans_b)
                for (int j = 0; j < N; ++j) c[j] += a * B[j * ldb + k];
            else
                for (int j = 0; j < N; ++j) c[j] += a * B[k * ldb + j];
        }
    }
}
#endif

void ra__cpu_gemm(ra_thread_ws *w, ra_rounding rounding, int trans_a, int trans_b, int M,
                  int N, int K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc)
{
    if (rounding != RA_F32 && w->bf16)
        ra__gemm_bf16(w, rounding == RA_BF16_SPLIT_A, trans_a, trans_b, M, N, K, alpha, A, lda,
                      B, ldb, beta, C, ldc);
    else if (w->f32)
        ra__gemm_f32(w, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
#ifdef RINGATTN_HAVE_BLAS
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, (int)lda, B,
                    (int)ldb, beta, C, (int)ldc);
#else
        plain_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

/* RINGATTN_CPU_GEMM: "blas" sends every tile product through BLAS sgemm, "own" takes the
   library's kernels wherever the CPU runs them; unset (or anything else): see below. */
static const char *gemm_choice(void)
{
    const char *env = getenv("RINGATTN_CPU_GEMM");
    return env ? env : "";
}

#ifdef RINGATTN_HAVE_BLAS
/* Whether BLAS runs float32 products below the CPU's AVX-512: OpenBLAS with kernels for an
   older ISA (Prescott on CPUs it does not know, or whatever OPENBLAS_CORETYPE forces).
   Another BLAS, or OpenBLAS's AVX-512 kernels, are kept: as fast as ours or faster. */
static int blas_below_avx512(void)
{
#ifdef OPENBLAS_VERSION
    static const char *older[] = {"Prescott", "Core2",   "Penryn",    "Dunnington", "Nehalem",
                                  "Atom",     "Sandybridge", "Haswell", "Zen",     "Barcelona",
                                  "Bulldozer", "Piledriver", "Steamroller", "Excavator"};
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof older / sizeof older[0]; ++i)
        if (strcmp(core, older[i]) == 0) return 1;
#endif
    return 0;
}
#endif

int ra__cpu_bf16_products(ringattn_dtype_t dt)
{
    return dt == RINGATTN_BFLOAT16 && strcmp(gemm_choice(), "blas") != 0 &&
           ra__gemm_bf16_supported();
}

int ra__cpu_f32_products(void)
{
    const char *choice = gemm_choice();
    if (strcmp(choice, "blas") == 0 || !ra__gemm_f32_supported()) return 0;
#ifdef RINGATTN_HAVE_BLAS
    return strcmp(choice, "own") == 0 || blas_below_avx512();
#else
    return 1; /* no BLAS: the own kernels wherever they run, plain loops elsewhere */
#endif
}
