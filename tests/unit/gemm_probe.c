/* The CPU backend's bfloat16 tile product (kernels/cpu/bf16_gemm.c) as functions for
   test_bf16_gemm.cpp, with the packing buffers a plan's workspace would hold. */
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

int ratest_gemm_bf16_supported(void) { return ra__gemm_bf16_supported(); }

/* 0 on success, -1 when the buffers cannot be had; max_dim bounds M, N and K; split_a: A in
   two bfloat16 parts (RA_BF16_SPLIT_A). */
int ratest_gemm_bf16(int max_dim, int split_a, int trans_a, int trans_b, int M, int N, int K,
                     float alpha, const float *A, long lda, const float *B, long ldb, float beta,
                     float *C, long ldc)
{
    ra_thread_ws w = {0};
    w.bf16 = 1;
    w.pack_a = malloc(ra__gemm_bf16_words(max_dim, 0) * sizeof *w.pack_a);
    w.pack_b = malloc(ra__gemm_bf16_words(max_dim, 1) * sizeof *w.pack_b);
    if (w.pack_a && w.pack_b)
        ra__gemm_bf16(&w, split_a, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const int ok = w.pack_a && w.pack_b;
    free(w.pack_a);
    free(w.pack_b);
    return ok ? 0 : -1;
}
