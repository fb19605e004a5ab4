/* The CPU backend's own tile products (kernels/cpu/bf16_gemm.c, f32_gemm.c) as one function for
   test_cpu_gemm.cpp, with the packing buffers a plan's workspace would hold. */
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

/* Whether this CPU runs kernel `kind` (0 bfloat16, 1 bfloat16 with A split, 2 float32). */
int ratest_gemm_supported(int kind)
{
    return kind == 2 ? ra__gemm_f32_supported() : ra__gemm_bf16_supported();
}

/* C = alpha op(A) op(B) + beta C by kernel `kind`; 0 on success, -1 when the buffers cannot be
   had; max_dim bounds M, N and K. */
int ratest_gemm(int kind, int max_dim, int trans_a, int trans_b, int M, int N, int K,
                float alpha, const float *A, long lda, const float *B, long ldb, float beta,
                float *C, long ldc)
{
    ra_thread_ws w = {0};
    size_t words[2];
    for (int operand = 0; operand < 2; ++operand) {
        const size_t b16 = ra__gemm_bf16_words(max_dim, operand);
        const size_t b32 = ra__gemm_f32_floats(max_dim, operand);
        words[operand] = b16 > b32 ? b16 : b32;
    }
    w.pack_a = malloc(words[0] * sizeof *w.pack_a);
    w.pack_b = malloc(words[1] * sizeof *w.pack_b);
    const int ok = w.pack_a && w.pack_b;
    if (ok && kind == 2)
        ra__gemm_f32(&w, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else if (ok)
        ra__gemm_bf16(&w, kind == 1, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                      ldc);
    free(w.pack_a);
    free(w.pack_b);
    return ok ? 0 : -1;
}
