// The tensor-core backward's pieces (backward_tc.cuh): its shared-memory layout, what each of
// its 8 warps owns, SPEC 7 on a warp's pairs, and the products that go through shared memory.
//
// Warp w owns key group kg = w % 4 (16 of the block's 64 keys) and half h = w / 4: the half of
// the query tile whose S^T and dP^T it computes (32 queries), and the half of the head-dim
// columns of dK, dV (its key group's rows) and dQ (query group kg's rows) it accumulates. So a
// lane holds 16 x D / 2 + 16 x D_v / 2 accumulators (64 floats at D = D_v = 128, half of what
// 4 warps of whole rows hold: no spills), and P and dZ reach the warps that need the other
// half's queries through shared memory, as in FlashAttention 2.
#pragma once

#include "kernels/cuda/backward_common.cuh"
#include "kernels/cuda/forward_tile.cuh"

namespace ra_bwd_tc {

using ra_fwd::lane_at;
using ra_fwd::swz;

constexpr int BK = RA_BWD_TC_KEYS, BQ = RA_BWD_TC_QUERIES, WARPS = 8, THREADS = 32 * WARPS;
constexpr int HALF_Q = BQ / 2; // a warp's queries of S^T and dP^T

// Shared memory, in 16-bit units: K [BK][D], V [BK][D_v], Q [QBUF][BQ][D] and dO
// [QBUF][BQ][D_v] (double buffered; single where a device's block would not hold them twice, an
// A100 at D = 256, or where two blocks an SM need it), P and dZ [BK][BQ] (key-major), all
// swizzled (forward_tile_layout.cuh); then the query tiles' row values [2][BQ] (16 bytes a row;
// FULL_FEATURES: their rows as the SIMT backward sees them, and a float a key for dBias), the
// block's place in its list (two query tiles and the cursor: 48 bytes that would otherwise take
// registers through the tile loop), and at SPEC 9's high level what P's and dZ's rounding lost,
// [BK][BQ] each. At D = D_v = 128: 116 KiB (the feature kernel 123), 84 single-buffered.
template <int D, int DV, bool FULL_FEATURES, int QBUF> struct layout {
    static constexpr size_t K = 0, V = K + BK * D, Q = V + BK * DV, DO = Q + QBUF * BQ * D,
                            P = DO + QBUF * BQ * DV, DZ = P + BK * BQ, ROWS = DZ + BK * BQ,
                            DB = ROWS + 2 * BQ * (FULL_FEATURES ? sizeof(ra_bwd::brow) / 2 : 8),
                            TILES = DB + (FULL_FEATURES ? BK * 2 : 0), LOST = TILES + 24;
    static constexpr size_t bytes(bool split) { return 2 * (LOST + (split ? 2 * BK * BQ : 0)); }
};

// The lane, computed again at each query tile (ra_opaque): the shared addresses derived from it
// are then computed where they are used, instead of hoisted out of the tile loop into registers.
__device__ __forceinline__ lane_at opaque_lane()
{
    const int tid = ra_opaque((int)threadIdx.x), lane = tid & 31;
    return lane_at{lane, tid >> 5, lane >> 2, lane & 3};
}

// A lane as its key group: the forward's helpers take the warp's 16 rows from lane_at::warp.
__device__ __forceinline__ lane_at key_group(const lane_at &ln)
{
    return lane_at{ln.lane, ln.warp % 4, ln.g, ln.t};
}

// A query row's values for the plain kernel: P = 2^(z c - shift log2 e) pscale, D_i, and a
// PARTIAL tile's allowed keys of the block's key tile (ra_fwd::keys_of_row: lo | end << 16).
// A row that contributes nothing gets pscale 0 (a row past the tile: Q = 0, so z = 0; a live
// one with no allowed key is in PARTIAL tiles only, where its interval is empty).
__device__ __forceinline__ ra_f32x4 row_values(const ra_bwd::brow &r, uint32_t keys)
{
    return ra_f32x4{r.empty ? 0.0f : r.shift, r.empty ? 0.0f : r.pscale, r.d, __uint_as_float(keys)};
}

// SPEC 7 on the warp's pairs, plain kernel: s (raw products of K shifted by 2^-qshift) becomes
// P, dp becomes dS = dZ. A PARTIAL tile's pairs outside their row's key interval give 0. A warp
// with a row whose shift is far from 0 (|shift log2 e| >= 64, SPEC 10 case 4) takes each
// rounded logit minus its shift first, as the forward does (far: a warp-uniform branch).
template <int QS, bool FAR>
__device__ __forceinline__ void plain_pairs(const lane_at &kl, ra_smem<ra_f32x4> rows, bool full,
                                            float cn, float (&s)[1][QS / 8][4],
                                            float (&dp)[1][QS / 8][4])
{
    const float ln2e = 1.4426950408889634f, c = cn * ln2e;
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int cc = 0; cc < 2; ++cc) {
            const ra_f32x4 r = rows[n * 8 + 2 * kl.t + cc];
            const uint32_t keys = __float_as_uint(r.w);
            const int lo = (int)(keys & 0xffffu), end = (int)(keys >> 16);
            RA_UNROLL
            for (int hh = 0; hh < 2; ++hh) {
                const int j = kl.warp * 16 + kl.g + 8 * hh;
                float &x = s[0][n][2 * hh + cc];
                const float e = FAR ? ra_exp2((ra_mul_rn(x, cn) - r.x) * ln2e) : ra_exp2(fmaf(x, c, -r.x * ln2e));
                const float p = full || (j >= lo && j < end) ? e * r.y : 0.0f;
                x = p;
                dp[0][n][2 * hh + cc] = p * (dp[0][n][2 * hh + cc] - r.z);
            }
        }
}

template <int QS>
__device__ __forceinline__ void plain_grads(const lane_at &kl, ra_smem<ra_f32x4> rows, bool full,
                                            float cn, float (&s)[1][QS / 8][4],
                                            float (&dp)[1][QS / 8][4])
{
    bool near = true;
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int cc = 0; cc < 2; ++cc) {
            const ra_f32x4 r = rows[n * 8 + 2 * kl.t + cc];
            near = near && fabsf(r.x) < 44.0f; // |shift log2 e| < 64
        }
    if (__all_sync(0xffffffffu, near)) plain_pairs<QS, false>(kl, rows, full, cn, s, dp);
    else plain_pairs<QS, true>(kl, rows, full, cn, s, dp);
}

// SPEC 7 on the warp's pairs with softcap, ALiBi or a key bias (ra_bwd::grads per pair, keys
// at positions pos0 + j stride, local rows kr0 + j, nk of them): s becomes P, dp dZ; db[hh]
// += the row sums of dS of key g + 8 hh over the warp's queries (in order, then over the quad).
template <int QS>
__device__ __forceinline__ void feature_grads(const ra_bwd_args &a, const lane_at &kl,
                                              ra_smem<ra_bwd::brow> rows, bool full, int64_t pos0,
                                              int64_t stride, int64_t kr0, int nk,
                                              float (&s)[1][QS / 8][4], float (&dp)[1][QS / 8][4],
                                              float (&db)[2])
{
    float part[2] = {0.0f, 0.0f};
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int e = 0; e < 4; ++e) {
            const int hh = e / 2, j = kl.warp * 16 + kl.g + 8 * hh;
            const ra_bwd::brow r = rows[n * 8 + 2 * kl.t + e % 2];
            ra_bwd::pair_grad g{0.0f, 0.0f, 0.0f};
            if (j < nk)
                g = full ? ra_bwd::grads<false>(a, r, s[0][n][e], dp[0][n][e], pos0 + j * stride, kr0 + j)
                         : ra_bwd::grads<true>(a, r, s[0][n][e], dp[0][n][e], pos0 + j * stride, kr0 + j);
            s[0][n][e] = g.p, dp[0][n][e] = g.dz;
            part[hh] += g.ds;
        }
    RA_UNROLL
    for (int hh = 0; hh < 2; ++hh) {
        part[hh] += __shfl_xor_sync(0xffffffffu, part[hh], 1);
        part[hh] += __shfl_xor_sync(0xffffffffu, part[hh], 2);
        db[hh] += part[hh];
    }
}

// The warp's P or dZ (its 16 keys x QS queries from column q0) into a key-major [BK][BQ] tile,
// two queries a 32-bit store, rounded to the storage dtype (SPEC 9's default level, as
// FlashAttention rounds them); at the high level (split) what the rounding lost into `lost`.
template <bool BF16, int QS>
__device__ __forceinline__ void store_pairs(ra_smem<uint16_t> tile, ra_smem<uint16_t> lost,
                                            bool split, const lane_at &kl, int q0,
                                            float (&x)[1][QS / 8][4])
{
    const ra_smem<uint32_t> t32 = ra_smem_as<uint32_t>(tile), l32 = ra_smem_as<uint32_t>(lost);
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
            const int at = swz<BQ>(kl.warp * 16 + kl.g + 8 * hh, q0 + n * 8 + 2 * kl.t) / 2;
            float &x0 = x[0][n][2 * hh], &x1 = x[0][n][2 * hh + 1];
            if (!split) {
                t32[at] = ra_pack_16x2(BF16, x0, x1);
                continue;
            }
            t32[at] = ra_fwd::split_p<BF16>(x0, x1);
            l32[at] = ra_pack_16x2(BF16, x0, x1);
        }
}

// acc (the warp's 16 keys x N columns from c0) += X^T Y over the tile's queries: X^T's A
// fragments from a key-major tile (P or dZ), Y's (dO or Q, [BQ][DY]) by ldmatrix.trans.
template <bool BF16, int DY, int N>
__device__ __forceinline__ void add_key_rows(ra_smem<uint16_t> xt, ra_smem<uint16_t> y,
                                             const lane_at &kl, int c0, float (&acc)[1][N / 8][4])
{
    RA_NO_UNROLL
    for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t xa[1][4];
        ra_fwd::q_fragment<BQ>(xt, kl, kl.warp * 16, kk, xa[0]);
        ra_fwd::pv_step<BF16, 1, DY, N>(y, kl, kk, xa, acc, c0);
    }
}

// The A fragment of query rows [r0, r0 + 16) and keys [16 kk, 16 kk + 16) of a key-major tile:
// its 8 x 8 parts transposed by ldmatrix.trans (each part's 8 rows on distinct banks).
__device__ __forceinline__ void query_fragment(ra_smem<uint16_t> t, const lane_at &ln, int r0,
                                               int kk, uint32_t f[4])
{
    const int m = ln.lane >> 3, r = ln.lane & 7;
    ra_ldmatrix_x4(true, f, t + swz<BQ>(kk * 16 + (m >> 1) * 8 + r, r0 + (m & 1) * 8));
}

// dQ of query group kg's 16 rows, columns [c0, c0 + D / 2), += dZ K (K by ldmatrix.trans), into
// the slice's float32 copy (row stride d; rows past nq and columns past d skipped); 32 columns
// at a time (registers: beside dK and dV).
template <bool BF16, int D, int DH>
__device__ __forceinline__ void add_dq(ra_smem<uint16_t> sdz, ra_smem<uint16_t> sk,
                                       const lane_at &kl, int c0, float *dq, int d, int nq)
{
    RA_NO_UNROLL
    for (int c = c0; c < c0 + D / 2; c += DH) {
        float acc[1][DH / 8][4];
        RA_UNROLL
        for (int n = 0; n < DH / 8; ++n)
            RA_UNROLL
            for (int e = 0; e < 4; ++e) acc[0][n][e] = 0.0f;
        RA_NO_UNROLL
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t za[1][4];
            query_fragment(sdz, kl, kl.warp * 16, kk, za[0]);
            ra_fwd::pv_step<BF16, 1, D, DH>(sk, kl, kk, za, acc, c);
        }
        RA_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
            const int row = kl.warp * 16 + kl.g + 8 * hh;
            RA_UNROLL
            for (int n = 0; n < DH / 8; ++n) {
                const int col = c + n * 8 + 2 * kl.t;
                if (row >= nq || col >= d) continue;
                ra_f32x2 *at = reinterpret_cast<ra_f32x2 *>(dq + (int64_t)row * d + col);
                ra_count_global_load(at, 8);
                ra_f32x2 v = *at;
                v.x += acc[0][n][2 * hh], v.y += acc[0][n][2 * hh + 1];
                ra_count_global_store(at, 8);
                *at = v;
            }
        }
    }
}

// The warp's rows of dK (times scale) or dV, columns [c0, c0 + N): stored in the storage dtype,
// or added to float32 sums (ring steps), from element at (the kv head's); keys past nk and
// columns past n skipped.
template <int N>
__device__ __forceinline__ void store_key_rows(const ra_bwd_args &a, const lane_at &kl, void *out,
                                               int64_t row0, int64_t rs, int nk, int c0, int n,
                                               float f, const float (&acc)[1][N / 8][4], int64_t at)
{
    RA_UNROLL
    for (int e = 0; e < 4; ++e) {
        const int j = kl.warp * 16 + kl.g + 8 * (e / 2);
        if (j >= nk) continue;
        RA_UNROLL
        for (int c = 0; c < N / 8; ++c) {
            const int col = c0 + c * 8 + 2 * kl.t + e % 2;
            if (col < n) ra_bwd::store(out, at + (row0 + j) * rs + col, f * acc[0][c][e], a.dtype, a.accumulate);
        }
    }
}

} // namespace ra_bwd_tc
