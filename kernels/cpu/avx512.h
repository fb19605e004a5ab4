/*
 * What the CPU backend's own AVX-512 tile products share (bf16_gemm.c, f32_gemm.c): the
 * compilers that build them, their target attributes, lane masks and a 16 x 16 transpose of
 * 32-bit elements. Internal to kernels/cpu; every function runs only where the CPU has the
 * ISA (ra__gemm_bf16_supported, ra__gemm_f32_supported check at plan creation).
 */
#ifndef RINGATTN_KERNELS_CPU_AVX512_H
#define RINGATTN_KERNELS_CPU_AVX512_H

/* GCC 10 or later on x86-64 (target attributes with AVX512-BF16); elsewhere the products stay
   on BLAS sgemm */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#define RA_CPU_AVX512_CODE 1
#else
#define RA_CPU_AVX512_CODE 0
#endif

/* The micro-kernels' block of C: RA_GEMM_MR rows x RA_GEMM_NR columns in 16 zmm registers. */
#define RA_GEMM_MR 8
#define RA_GEMM_NR 32

#if RA_CPU_AVX512_CODE

#include <immintrin.h>
#include <stdint.h>

#define RA_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define RA_AVX512_BF16_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

/* The first n (0..16) lanes. */
static inline __mmask16 ra__lanes(int n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}

/* 16 x 16 transpose of 32-bit words in r. */
RA_AVX512_TARGET static inline void ra__transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) { /* u[4i + j], lane L: rows 4i..4i+3 of column 4L + j */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; ++j) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
        r[j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[8 + j] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

/* Rows [0, rows) and columns [0, cols) of a micro-kernel's block into C: alpha acc + beta C,
   beta 0 (C not read) or 1. */
RA_AVX512_TARGET static inline void ra__store_block(__m512 acc[RA_GEMM_MR][2], int rows,
                                                    int cols, float alpha, float beta, float *c,
                                                    int64_t ldc)
{
    const __mmask16 m0 = ra__lanes(cols), m1 = ra__lanes(cols - 16);
    const __m512 va = _mm512_set1_ps(alpha);
    for (int i = 0; i < rows; ++i) {
        float *row = c + i * ldc;
        __m512 y0 = _mm512_mul_ps(va, acc[i][0]), y1 = _mm512_mul_ps(va, acc[i][1]);
        if (beta != 0.0f) {
            y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(m0, row));
            y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(m1, row + 16));
        }
        _mm512_mask_storeu_ps(row, m0, y0);
        _mm512_mask_storeu_ps(row + 16, m1, y1);
    }
}

#endif

#endif
