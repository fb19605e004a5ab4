/*
 * Tile products with bfloat16 operands and float32 accumulation (AVX512-BF16 vdpbf16ps), for
 * plans whose storage is bfloat16 (SPEC 9: error at most 2x a plain same-precision
 * implementation). The float32 operands are rounded to bfloat16 (nearest even) while they are
 * packed: exact for Q, K, V and dO, which were bfloat16 in storage; P and dS are split into
 * two parts, the high bfloat16 part and what it lost (ra_rounding in cpu.h says why).
 * vdpbf16ps multiplies pairs of bfloat16 along the reduction dimension, so both operands are
 * packed as 32-bit words holding (even k, odd k):
 *   A: rows of M, [M_pad][parts x kp] words ("rows"), or [parts x kp][M_pad] ("columns") for
 *      a transposed A;
 *   B: panels of 32 columns, [N_pad / 32][kp][32] words.
 * kp = ceil(K / 2); the padding is zero; the parts of a split A go against the same B. The
 * micro-kernel keeps an 8 x 32 block of C in 16 registers and adds the pairs in k order: the
 * sums' order is fixed (bitwise repeatable, and independent of the thread count, SPEC 9).
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/cpu.h"

#define MR RA_GEMM_MR
#define NR RA_GEMM_NR

#if RA_CPU_AVX512_CODE

#define TARGET RA_AVX512_BF16_TARGET

/*
 * What a float32 vector becomes in a packed operand: rounded to bfloat16 (nearest even), or,
 * split in two, its high bfloat16 part (truncated: exact, and never rounded up to infinity)
 * and the low part, what the high one lost (exact in float32, then rounded; 0 where the high
 * part is all of it, infinities included, so that hi + lo is never inf - inf).
 */
typedef enum part { PART_ROUNDED, PART_HIGH, PART_LOW } part;

TARGET static inline __m512 part_of(__m512 x, part which)
{
    if (which == PART_ROUNDED) return x;
    const __m512 hi = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0xFFFF0000u)));
    if (which == PART_HIGH) return hi;
    const __mmask16 rest = _mm512_cmp_ps_mask(x, hi, _CMP_NEQ_UQ); /* NaN: NaN */
    return _mm512_maskz_sub_ps(rest, x, hi);
}

/* The part `which` of a run of a row, 32 floats as x[0] (the first 16) and x[1], as 16 (even,
   odd) words. */
TARGET static inline __m512i words_of_run(const __m512 x[2], part which)
{
    return (__m512i)_mm512_cvtne2ps_pbh(part_of(x[1], which), part_of(x[0], which));
}

/* Elements [k, k + 32) of a float row of K elements (zero past K; K = 0: reads nothing). */
TARGET static inline void load_run(const float *row, int k, int K, __m512 x[2])
{
    x[0] = _mm512_maskz_loadu_ps(ra__lanes(K - k), row + k);
    x[1] = _mm512_maskz_loadu_ps(ra__lanes(K - k - 16), row + k + 16);
}

/* The part `which` of columns [n, n + 16) of two float rows (even k, odd k; odd may be NULL:
   zero) as 16 words. */
TARGET static inline __m512i words_of_rows(const float *even, const float *odd, int n, int N,
                                           part which)
{
    const __mmask16 m = ra__lanes(N - n);
    const __m512 e = part_of(_mm512_maskz_loadu_ps(m, even + n), which);
    const __m512 o = odd ? part_of(_mm512_maskz_loadu_ps(m, odd + n), which) : _mm512_setzero_ps();
    const __m256i he = (__m256i)_mm512_cvtneps_pbh(e), ho = (__m256i)_mm512_cvtneps_pbh(o);
    return _mm512_or_si512(_mm512_cvtepu16_epi32(he),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(ho), 16));
}

/* Part number i of an A in `parts` parts. */
static inline part part_number(int i, int parts)
{
    return parts == 1 ? PART_ROUNDED : (i == 0 ? PART_HIGH : PART_LOW);
}

/*
 * A [M, K] with rows of k (lda): [M_pad][parts x kp] words, rows past M zero; in two parts
 * (split), the high part's words and then the low part's (part_of).
 */
TARGET static void pack_a_rows(const float *A, int64_t lda, int M, int K, int parts,
                               uint32_t *dst)
{
    const int kp = (K + 1) / 2, mpad = (M + MR - 1) / MR * MR;
    __m512 x[2];
    for (int m = 0; m < mpad; ++m)
        for (int k = 0; k < 2 * kp; k += 32) {
            load_run(A + m * lda, k, m < M ? K : 0, x);
            for (int i = 0; i < parts; ++i)
                _mm512_mask_storeu_epi32(dst + ((size_t)m * parts + i) * kp + k / 2,
                                         ra__lanes(kp - k / 2),
                                         words_of_run(x, part_number(i, parts)));
        }
}

/* A = S^T for S [K, M] with rows of m (lds): [parts x kp][M_pad] words, columns past M zero. */
TARGET static void pack_a_columns(const float *S, int64_t lds, int M, int K, int parts,
                                  uint32_t *dst)
{
    const int kp = (K + 1) / 2, mpad = (M + MR - 1) / MR * MR;
    for (int i = 0; i < parts; ++i)
        for (int p = 0; p < kp; ++p) {
            const float *even = S + 2 * p * lds, *odd = 2 * p + 1 < K ? even + lds : NULL;
            for (int m = 0; m < mpad; m += 16)
                _mm512_mask_storeu_epi32(dst + ((size_t)i * kp + p) * mpad + m,
                                         ra__lanes(mpad - m),
                                         words_of_rows(even, odd, m, M, part_number(i, parts)));
        }
}

/* B [K, N] with rows of n (ldb): panels [N_pad / 32][kp][32]. */
TARGET static void pack_b_rows(const float *B, int64_t ldb, int N, int K, uint32_t *dst)
{
    const int kp = (K + 1) / 2, panels = (N + NR - 1) / NR;
    for (int p = 0; p < kp; ++p) {
        const float *even = B + 2 * p * ldb, *odd = 2 * p + 1 < K ? even + ldb : NULL;
        for (int n = 0; n < panels * NR; n += 16)
            _mm512_storeu_si512(dst + ((size_t)(n / NR) * kp + p) * NR + n % NR,
                                words_of_rows(even, odd, n, N, PART_ROUNDED));
    }
}

/* B = S^T for S [N, K] with rows of k (lds): the same panels, by 16 x 16 word transposes. */
TARGET static void pack_b_columns(const float *S, int64_t lds, int N, int K, uint32_t *dst)
{
    const int kp = (K + 1) / 2, panels = (N + NR - 1) / NR;
    __m512i r[16];
    __m512 x[2];
    for (int n = 0; n < panels * NR; n += 16)
        for (int p = 0; p < kp; p += 16) {
            for (int i = 0; i < 16; ++i) {
                load_run(S + (n + i) * lds, 2 * p, n + i < N ? K : 0, x);
                r[i] = words_of_run(x, PART_ROUNDED);
            }
            ra__transpose16(r); /* r[w]: words p + w of rows n..n+15 */
            uint32_t *panel = dst + (size_t)(n / NR) * kp * NR + n % NR;
            for (int w = 0; w < 16 && p + w < kp; ++w)
                _mm512_storeu_si512(panel + (size_t)(p + w) * NR, r[w]);
        }
}

/*
 * C block [rows <= MR, cols <= NR] = alpha A B + beta C from A words (m stride am, k-pair
 * stride ap; parts x kp pairs, every part against the same B) and one B panel; MR x NR in
 * registers, pairs summed in k order, part after part.
 */
TARGET static inline __attribute__((always_inline)) void
micro(const uint32_t *a, int64_t am, int64_t ap, const uint32_t *b, int kp, int parts,
      float alpha, float beta, float *c, int64_t ldc, int rows, int cols)
{
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int p = 0; p < parts * kp; ++p) {
        const int pb = p < kp ? p : p - kp;
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)pb * NR);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)pb * NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i * am + p * ap]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
    }
    ra__store_block(acc, rows, cols, alpha, beta, c, ldc);
}

/* Every block of C over the packed operands (columns: A packed as [parts x kp][M_pad]). */
TARGET static void blocks(const uint32_t *a, int columns, int parts, const uint32_t *b, int M,
                          int N, int K, float alpha, float beta, float *C, int64_t ldc)
{
    const int kp = (K + 1) / 2, mpad = (M + MR - 1) / MR * MR;
    for (int n = 0; n < N; n += NR) {
        const uint32_t *panel = b + (size_t)(n / NR) * kp * NR;
        const int cols = N - n < NR ? N - n : NR;
        for (int m = 0; m < M; m += MR) {
            const int rows = M - m < MR ? M - m : MR;
            if (columns)
                micro(a + m, 1, mpad, panel, kp, parts, alpha, beta, C + m * ldc + n, ldc, rows,
                      cols);
            else
                micro(a + (size_t)m * parts * kp, parts * kp, 1, panel, kp, parts, alpha, beta,
                      C + m * ldc + n, ldc, rows, cols);
        }
    }
}

void ra__gemm_bf16(ra_thread_ws *w, int split_a, int trans_a, int trans_b, int M, int N, int K,
                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc)
{
    const int parts = split_a ? 2 : 1;
    if (trans_a) pack_a_columns(A, lda, M, K, parts, w->pack_a);
    else pack_a_rows(A, lda, M, K, parts, w->pack_a);
    if (trans_b) pack_b_columns(B, ldb, N, K, w->pack_b);
    else pack_b_rows(B, ldb, N, K, w->pack_b);
    blocks(w->pack_a, trans_a, parts, w->pack_b, M, N, K, alpha, beta, C, ldc);
}

int ra__gemm_bf16_supported(void)
{
    /* the float32 kernels' AVX-512 subset (RA_AVX512_TARGET), and vdpbf16ps */
    return ra__gemm_f32_supported() && __builtin_cpu_supports("avx512bf16");
}

#else /* no AVX512-BF16 code on this compiler or architecture: the products stay float32 */

void ra__gemm_bf16(ra_thread_ws *w, int split_a, int trans_a, int trans_b, int M, int N, int K,
                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc)
{
    (void)w, (void)split_a, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K;
    (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
}

int ra__gemm_bf16_supported(void) { return 0; }

#endif

size_t ra__gemm_bf16_words(int max_dim, int operand_b)
{
    const int kp = (max_dim + 1) / 2, align = operand_b ? NR : MR;
    return (size_t)((max_dim + align - 1) / align * align) * (size_t)kp * (operand_b ? 1 : 2);
}
