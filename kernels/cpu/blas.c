/* The CPU backend's tile products: sgemm or bfloat16 (bf16_gemm.c); OpenBLAS's threads and
   kernel choice. */
#include <cblas.h>
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

/* Older OpenBLAS builds do not recognise newer CPUs: they fall back to the SSE3 "Prescott"
   kernels (4x slower than an AVX2 CPU can do), or to the AVX2 ones on AVX-512 CPUs such as
   AMD Zen 4 and 5 (2x slower: OpenBLAS 0.3.21 picks Haswell there). Say so once. */
static void check_kernel(void)
{
    const char *core = openblas_get_corename();
#if defined(__x86_64__) && defined(__GNUC__)
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const int sse = core && (strcmp(core, "Prescott") == 0 || strcmp(core, "Core2") == 0);
    const int avx2 = core && (strcmp(core, "Haswell") == 0 || strcmp(core, "Zen") == 0);
    if ((sse && __builtin_cpu_supports("avx2")) || (avx2 && avx512))
        ra__log(RA_LOG_WARN, 0, 1,
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

void ra__cpu_gemm(ra_thread_ws *w, ra_rounding rounding, int trans_a, int trans_b, int M,
                  int N, int K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc)
{
    if (rounding != RA_F32 && w->bf16) {
        ra__gemm_bf16(w, rounding == RA_BF16_SPLIT_A, trans_a, trans_b, M, N, K, alpha, A, lda,
                      B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, (int)lda, B, (int)ldb,
                beta, C, (int)ldc);
}

int ra__cpu_bf16_products(ringattn_dtype_t dt)
{
    const char *env = getenv("RINGATTN_CPU_BF16");
    return dt == RINGATTN_BFLOAT16 && !(env && strcmp(env, "0") == 0) &&
           ra__gemm_bf16_supported();
}
