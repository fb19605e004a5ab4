/*
 * float32 tile products on AVX-512 (x86-64-v4 CPUs), so that their speed does not depend on
 * which kernels BLAS runs (OpenBLAS's for an older ISA: Prescott on CPUs it does not know, or
 * Haswell forced by OPENBLAS_CORETYPE on an AVX-512 CPU, half the speed). The micro-kernel
 * keeps an 8 x 32 block of C in 16 registers and multiplies in k order with FMA, so sums are
 * bitwise repeatable and do not depend on the thread count (SPEC 9). Both operands are copied into panels that the micro-kernel
 * reads in order, zero past M and N: A into panels of 8 rows, [M_pad / 8][K][8] floats (by
 * 16 x 16 transposes of a row-major A, by rows of a transposed one), B into panels of 32
 * columns, [N_pad / 32][K][32] (by rows, or by 16 x 16 transposes of a transposed B).
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/cpu.h"

#define MR RA_GEMM_MR
#define NR RA_GEMM_NR

#if RA_CPU_AVX512_CODE

#define TARGET RA_AVX512_TARGET

/* A [M, K] with rows of k (lda) as panels of MR rows. */
TARGET static void pack_a_rows(const float *A, int64_t lda, int M, int K, float *dst)
{
    const int mpad = (M + MR - 1) / MR * MR;
    __m512i r[16];
    for (int m = 0; m < mpad; m += 16)
        for (int k = 0; k < K; k += 16) {
            for (int i = 0; i < 16; ++i)
                r[i] = _mm512_castps_si512(_mm512_maskz_loadu_ps(
                    ra__lanes(m + i < M ? K - k : 0), A + (m + i) * lda + k));
            ra__transpose16(r); /* r[j]: element k + j of rows m..m+15 */
            for (int j = 0; j < 16 && k + j < K; ++j) {
                const __m512 col = _mm512_castsi512_ps(r[j]);
                _mm256_storeu_ps(dst + ((size_t)(m / MR) * K + k + j) * MR,
                                 _mm512_castps512_ps256(col));
                if (m + MR < mpad)
                    _mm256_storeu_ps(dst + ((size_t)(m / MR + 1) * K + k + j) * MR,
                                     _mm512_extractf32x8_ps(col, 1));
            }
        }
}

/* A = S^T for S [K, M] with rows of m (lds) as panels of MR rows. */
TARGET static void pack_a_columns(const float *S, int64_t lds, int M, int K, float *dst)
{
    for (int m = 0; m < M; m += MR)
        for (int k = 0; k < K; ++k)
            _mm256_storeu_ps(dst + ((size_t)(m / MR) * K + k) * MR,
                             _mm256_maskz_loadu_ps((__mmask8)ra__lanes(M - m), S + k * lds + m));
}

/* B [K, N] with rows of n (ldb) as panels. */
TARGET static void pack_b_rows(const float *B, int64_t ldb, int N, int K, float *dst)
{
    const int panels = (N + NR - 1) / NR;
    for (int k = 0; k < K; ++k)
        for (int n = 0; n < panels * NR; n += 16)
            _mm512_storeu_ps(dst + ((size_t)(n / NR) * K + k) * NR + n % NR,
                             _mm512_maskz_loadu_ps(ra__lanes(N - n), B + k * ldb + n));
}

/* B = S^T for S [N, K] with rows of k (lds) as panels. */
TARGET static void pack_b_columns(const float *S, int64_t lds, int N, int K, float *dst)
{
    const int panels = (N + NR - 1) / NR;
    __m512i r[16];
    for (int n = 0; n < panels * NR; n += 16)
        for (int k = 0; k < K; k += 16) {
            for (int i = 0; i < 16; ++i)
                r[i] = _mm512_castps_si512(_mm512_maskz_loadu_ps(
                    ra__lanes(n + i < N ? K - k : 0), S + (n + i) * lds + k));
            ra__transpose16(r); /* r[j]: element k + j of rows n..n+15 */
            float *panel = dst + (size_t)(n / NR) * K * NR + n % NR;
            for (int j = 0; j < 16 && k + j < K; ++j)
                _mm512_storeu_ps(panel + (size_t)(k + j) * NR, _mm512_castsi512_ps(r[j]));
        }
}

/* C block [rows <= MR, cols <= NR] = alpha A B + beta C from one A panel and one B panel. */
TARGET static inline __attribute__((always_inline)) void
micro(const float *a, const float *b, int K, float alpha, float beta, float *c, int64_t ldc,
      int rows, int cols)
{
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; ++k) {
        const __m512 b0 = _mm512_loadu_ps(b + (size_t)k * NR);
        const __m512 b1 = _mm512_loadu_ps(b + (size_t)k * NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m512 ai = _mm512_set1_ps(a[(size_t)k * MR + i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    ra__store_block(acc, rows, cols, alpha, beta, c, ldc);
}

TARGET void ra__gemm_f32(ra_thread_ws *w, int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                         float beta, float *C, int64_t ldc)
{
    float *pa = (float *)w->pack_a, *pb = (float *)w->pack_b;
    if (trans_a) pack_a_columns(A, lda, M, K, pa);
    else pack_a_rows(A, lda, M, K, pa);
    if (trans_b) pack_b_columns(B, ldb, N, K, pb);
    else pack_b_rows(B, ldb, N, K, pb);
    for (int n = 0; n < N; n += NR) {
        const float *panel = pb + (size_t)(n / NR) * K * NR;
        const int cols = N - n < NR ? N - n : NR;
        for (int m = 0; m < M; m += MR)
            micro(pa + (size_t)(m / MR) * K * MR, panel, K, alpha, beta, C + m * ldc + n, ldc,
                  M - m < MR ? M - m : MR, cols);
    }
}

int ra__gemm_f32_supported(void)
{
    __builtin_cpu_init(); /* RA_AVX512_TARGET's features */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

#else /* no AVX-512 code on this compiler or architecture: BLAS sgemm only */

void ra__gemm_f32(ra_thread_ws *w, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc)
{
    (void)w, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A;
    (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
}

int ra__gemm_f32_supported(void) { return 0; }

#endif

size_t ra__gemm_f32_floats(int max_dim, int operand_b)
{
    const int align = operand_b ? NR : MR;
    return (size_t)((max_dim + align - 1) / align * align) * (size_t)max_dim;
}
