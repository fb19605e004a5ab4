// The backward on tensor cores for bf16 and f16 storage (SPEC 7; DESIGN: CUDA: the backend),
// FlashAttention 2's key-major form: a block owns a tile of 64 keys of a kv head, keeps dK and
// dV in float32 registers (each of its 4 warps 16 keys), and walks the query tiles of 64 rows
// its mask allows (the key-major tile list, EMPTY tiles not listed), for every query head of
// the kv head's GQA group in order. Per query tile, each warp computes by mma.sync m16n8k16:
//   S^T = K Q^T and dP^T = V dO^T (K, V as A fragments, Q, dO as B: the forward's scores_step),
//   P and dS = P (dP - D_i) in registers (SPEC 7; dZ = dS times the softcap's derivative),
//   dV += P^T dO and dK += dZ^T Q (P, dZ as A fragments from the accumulators, dO and Q by
//   ldmatrix.trans: the forward's accumulate_pv, which rounds P and dZ to the storage dtype at
//   SPEC 9's default level and splits them in two 16-bit parts at the high level),
// then stores dZ to shared memory (rounded; at the high level what the rounding lost in a
// second tile), and each warp adds the dQ partial of 16 query rows, dZ K, to its slice's
// float32 copy of dQ: S and dP are computed once (5 products, no second pass).
//
// dQ deterministically without atomics or blocks waiting on each other (FlashAttention 2's
// deterministic mode): the grid is (slices, kv-head blocks); slice s walks the list's key tiles
// s, s + S, s + 2 S, ... in order and adds into its own copy of dQ, [S][H][T_q][D] float32,
// zeroed before the launch; ra_bwd_dq_sum_kernel then sums the copies in slice order. Every
// element has one writer at a time and a fixed order of sums: results are bitwise repeatable and
// independent of the blocks' schedule (the emulation runs them in any order).
//
// Compile time: the dtype, the head-dim tiles (D, D_v <= 128) and the feature set, as in the
// forward: the plain kernel (no softcap, ALiBi or key bias) computes p = 2^(z c - shift log2 e)
// pscale from each row's values (one 16-byte load a row), a PARTIAL tile's mask from each row's
// key interval; FULL_FEATURES computes SPEC 7 per element (ra_bwd::grads: the SIMT backward's,
// with the forward's logit), and dBias as the column sums of dS.
#pragma once

#include "kernels/cuda/backward_common.cuh"
#include "kernels/cuda/forward_tile.cuh"

namespace ra_bwd_tc {

using ra_fwd::lane_at;
using ra_fwd::swz;

constexpr int BK = RA_BWD_TC_KEYS, BQ = RA_BWD_TC_QUERIES;

// Shared memory, in 16-bit units: K [BK][D], V [BK][D_v], Q and dO [2][BQ][...] (double
// buffered), dZ [BQ][BK], all swizzled (forward_tile_layout.cuh); then the query tiles' row
// values [2][BQ] (16 bytes a row), for FULL_FEATURES their rows as the SIMT backward sees
// them [2][BQ], and at the high level what dZ's rounding lost [BQ][BK].
template <int D, int DV, bool FULL_FEATURES> struct layout {
    static constexpr int QS = D + DV > 128 ? 32 : 64; // the query sub-tile (registers)
    static constexpr size_t K = 0, V = K + BK * D, Q = V + BK * DV, DO = Q + 2 * BQ * D,
                            DZ = DO + 2 * BQ * DV, ROWS = DZ + BQ * BK, BROWS = ROWS + 2 * BQ * 8,
                            DZ_LOST = BROWS + (FULL_FEATURES ? BQ * sizeof(ra_bwd::brow) : 0);
    // at SPEC 9's high level dZ's second part follows (one block per SM at D = D_v = 128 then)
    static constexpr size_t bytes(bool split) { return 2 * (DZ_LOST + (split ? BQ * BK : 0)); }
};

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
__device__ __forceinline__ void plain_pairs(const lane_at &ln, ra_smem<ra_f32x4> rows, bool full,
                                            float cn, float (&s)[1][QS / 8][4],
                                            float (&dp)[1][QS / 8][4])
{
    const float ln2e = 1.4426950408889634f, c = cn * ln2e;
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int cc = 0; cc < 2; ++cc) {
            const ra_f32x4 r = rows[n * 8 + 2 * ln.t + cc];
            const uint32_t keys = __float_as_uint(r.w);
            const int lo = (int)(keys & 0xffffu), end = (int)(keys >> 16);
            RA_UNROLL
            for (int hh = 0; hh < 2; ++hh) {
                const int j = ln.warp * 16 + ln.g + 8 * hh;
                float &x = s[0][n][2 * hh + cc];
                const float e = FAR ? ra_exp2((ra_mul_rn(x, cn) - r.x) * ln2e) : ra_exp2(fmaf(x, c, -r.x * ln2e));
                const float p = full || (j >= lo && j < end) ? e * r.y : 0.0f;
                x = p;
                dp[0][n][2 * hh + cc] = p * (dp[0][n][2 * hh + cc] - r.z);
            }
        }
}

template <int QS>
__device__ __forceinline__ void plain_grads(const lane_at &ln, ra_smem<ra_f32x4> rows, bool full,
                                            float cn, float (&s)[1][QS / 8][4],
                                            float (&dp)[1][QS / 8][4])
{
    bool near = true;
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int cc = 0; cc < 2; ++cc) {
            const ra_f32x4 r = rows[n * 8 + 2 * ln.t + cc];
            near = near && fabsf(r.x) < 44.0f; // |shift log2 e| < 64
        }
    if (__all_sync(0xffffffffu, near)) plain_pairs<QS, false>(ln, rows, full, cn, s, dp);
    else plain_pairs<QS, true>(ln, rows, full, cn, s, dp);
}

// SPEC 7 on the warp's pairs with softcap, ALiBi or a key bias (ra_bwd::grads per pair, keys
// at positions pos0 + j stride, local rows kr0 + j, nk of them): s becomes P, dp dZ; db[hh]
// += the row sums of dS of key g + 8 hh over the tile's queries (in order, then over the quad).
template <int QS>
__device__ __forceinline__ void feature_grads(const ra_bwd_args &a, const lane_at &ln,
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
            const int hh = e / 2, j = ln.warp * 16 + ln.g + 8 * hh;
            const ra_bwd::brow r = rows[n * 8 + 2 * ln.t + e % 2];
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

// dZ of the warp's keys into the [BQ][BK] tile (query rows), rounded to 16 bits.
template <bool BF16, int QS>
__device__ __forceinline__ void store_dz(ra_smem<uint16_t> sdz, const lane_at &ln,
                                         const float (&dz)[1][QS / 8][4])
{
    RA_UNROLL
    for (int n = 0; n < QS / 8; ++n)
        RA_UNROLL
        for (int e = 0; e < 4; ++e)
            sdz[swz<BK>(n * 8 + 2 * ln.t + e % 2, ln.warp * 16 + ln.g + 8 * (e / 2))] =
                (uint16_t)(ra_pack_16x2(BF16, dz[0][n][e], 0.0f) & 0xffffu);
}

// dQ of the warp's 16 query rows += dZ K (K by ldmatrix.trans), into its slice's float32 copy
// (row stride d; rows past nq skipped); DH columns at a time (registers: beside dK and dV).
template <bool BF16, int D>
__device__ __forceinline__ void add_dq(ra_smem<uint16_t> sdz, ra_smem<uint16_t> sk,
                                       const lane_at &ln, float *dq, int d, int nq)
{
    constexpr int DH = D > 64 ? 32 : D;
    RA_NO_UNROLL
    for (int c0 = 0; c0 < D; c0 += DH) {
        float acc[1][DH / 8][4];
        RA_UNROLL
        for (int n = 0; n < DH / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 4; ++c) acc[0][n][c] = 0.0f;
        RA_UNROLL
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t za[1][4];
            ra_fwd::q_fragment<BK>(sdz, ln, ln.warp * 16, kk, za[0]);
            ra_fwd::pv_step<BF16, 1, D, DH>(sk, ln, kk, za, acc, c0);
        }
        RA_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
            const int row = ln.warp * 16 + ln.g + 8 * hh;
            RA_UNROLL
            for (int n = 0; n < DH / 8; ++n) {
                const int col = c0 + n * 8 + 2 * ln.t;
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

// The warp's rows of dK (times scale) or dV: stored in the storage dtype, or added to float32
// sums (ring steps), from element at (the kv head's); keys past nk and columns past n skipped.
template <int DX>
__device__ __forceinline__ void store_key_rows(const ra_bwd_args &a, const lane_at &ln, void *out,
                                               int64_t row0, int64_t rs, int nk, int n, float f,
                                               const float (&acc)[1][DX / 8][4], int64_t at)
{
    RA_UNROLL
    for (int e = 0; e < 4; ++e) {
        const int j = ln.warp * 16 + ln.g + 8 * (e / 2);
        if (j >= nk) continue;
        RA_UNROLL
        for (int c = 0; c < DX / 8; ++c) {
            const int col = c * 8 + 2 * ln.t + e % 2;
            if (col < n) ra_bwd::store(out, at + (row0 + j) * rs + col, f * acc[0][c][e], a.dtype, a.accumulate);
        }
    }
}

} // namespace ra_bwd_tc

namespace ra_bwd_tc {

// A key tile's place (the key-major list's item): loaded where a step needs it rather than held
// in registers through the query loop, which dK's and dV's accumulators fill.
struct key_place {
    ra_span ks;
    int64_t krow, delta;
    ra_segment kseg;
};

__device__ __forceinline__ key_place place_of(const ra_bwd_args &a, int item)
{
    key_place p;
    const ra_tile_item it = a.kitems[item];
    ra_fwd::item_tile(it, a.f.ksegs, BK, &p.ks, &p.krow);
    p.kseg = a.f.ksegs[it.seg];
    p.delta = a.f.delta[p.ks.seq];
    return p;
}

} // namespace ra_bwd_tc

// Grid: (slices, kv-head blocks: gb = gridDim.y == 1 ? H_kv : 1 kv heads a block, so that with a
// bias head shared by kv heads one block owns its dBias rows); 128 threads, two blocks per SM.
template <bool BF16, int D, int DV, bool FULL_FEATURES>
__global__ void __launch_bounds__(128, 2) ra_bwd_tc_kernel(ra_bwd_args a)
{
    using namespace ra_bwd_tc;
    using L = layout<D, DV, FULL_FEATURES>;
    constexpr int QS = L::QS;
    RA_DYNAMIC_SMEM(uint16_t, sm);
    const ra_smem<uint16_t> sk = sm + L::K, sv = sm + L::V, sq = sm + L::Q, sdo = sm + L::DO,
                            sdz = sm + L::DZ, sdz_lost = sm + L::DZ_LOST;
    const ra_smem<ra_f32x4> srows = ra_smem_as<ra_f32x4>(sm + L::ROWS);
    const ra_smem<ra_bwd::brow> sbrows = ra_smem_as<ra_bwd::brow>(sm + L::BROWS);
    const ra_attn_args &f = a.f;
    const int gb = gridDim.y == 1 ? f.kv_heads : 1;
    const int qshift = ra_fwd::q_shift(f), tid = (int)threadIdx.x;
    for (int item = (int)blockIdx.x; item < a.key_items; item += (int)gridDim.x) {
        const int nk = (int)place_of(a, item).ks.count;
        float db[2] = {0.0f, 0.0f}; // dBias of the warp's keys g, g + 8, bias head hb_open
        int hb_open = -1;
        auto flush_dbias = [&]() {
            const lane_at ln = ra_fwd::this_lane();
            const int64_t krow = place_of(a, item).krow;
            RA_UNROLL
            for (int hh = 0; hh < 2; ++hh) {
                const int j = ln.warp * 16 + ln.g + 8 * hh;
                if (hb_open >= 0 && a.dbias && ln.t == 0 && j < nk)
                    ra_bwd::store(a.dbias, (int64_t)hb_open * f.bias_ld + krow + j, db[hh], 0, a.accumulate);
                db[hh] = 0.0f;
            }
        };
        for (int g = (int)blockIdx.y * gb; g < ((int)blockIdx.y + 1) * gb; ++g) {
            ra_cp_async_wait<0>(); // a head that met no query tile left K, V in flight
            __syncthreads();       // every warp is done with the previous K, V and query tiles
            {
                const key_place kp = place_of(a, item);
                const int k0 = a.kitems[item].first;
                ra_fwd::load_tile<D>(sk, static_cast<const uint16_t *>(f.k) + kp.kseg.row * f.k_row + g * f.k_head,
                                     f.k_row, k0, (int)kp.kseg.span.count, BK, f.d);
                ra_fwd::load_tile<DV>(sv, static_cast<const uint16_t *>(f.v) + kp.kseg.row * f.v_row + g * f.v_head,
                                      f.v_row, k0, (int)kp.kseg.span.count, BK, f.dv);
                ra_cp_async_commit();
            }
            if (qshift) { // SPEC 9: K instead of Q times 2^-qshift (the same products), once
                ra_cp_async_wait<0>();
                __syncthreads();
                ra_fwd::shift_tile(sk, BK * D, qshift);
            }
            float dk[1][D / 8][4], dv[1][DV / 8][4];
            RA_UNROLL
            for (int n = 0; n < D / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 4; ++c) dk[0][n][c] = 0.0f;
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 4; ++c) dv[0][n][c] = 0.0f;
            const int G = f.heads / f.kv_heads;
            for (int h = g * G; h < (g + 1) * G; ++h) {
                const int hb = f.bias ? h / (f.heads / f.bias_heads) : 0;
                if (FULL_FEATURES && hb != hb_open) flush_dbias(), hb_open = hb;
                // SPEC 6: a query tile no row of which keeps a key of this tile is skipped
                float kmax = -INFINITY;
                if (FULL_FEATURES && f.thr_b) {
                    const int64_t krow = place_of(a, item).krow;
                    for (int j = 0; j < nk; ++j) kmax = fmaxf(kmax, f.bias[(int64_t)hb * f.bias_ld + krow + j]);
                }
                auto kept = [&](const ra_segment &qseg, int q0, int n) {
                    const int64_t at = (int64_t)hb * f.tq + qseg.row + q0 + tid;
                    return __syncthreads_or(tid < n && ra__topk_block_kept(kmax, f.thr_b[at])) != 0;
                };
                // Q, dO and the rows of a query tile into buffer b, one cp.async group
                auto issue = [&](const ra_fwd::key_tile &qt, int b) {
                    const ra_segment qseg = f.qsegs[qt.seg];
                    const int64_t qr = qseg.row + qt.k0;
                    ra_fwd::load_tile<D>(sq + b * BQ * D, static_cast<const uint16_t *>(f.q) + qr * f.q_row + h * f.q_head,
                                         f.q_row, 0, qt.count, BQ, f.d);
                    ra_fwd::load_tile<DV>(sdo + b * BQ * DV, static_cast<const uint16_t *>(a.dout) + qr * a.do_row + h * a.do_head,
                                          a.do_row, 0, qt.count, BQ, f.dv);
                    ra_cp_async_commit();
                    if (tid >= BQ) return;
                    const key_place kp = place_of(a, item);
                    const ra_span qs = ra__segment_tile(&qseg, qt.k0, BQ);
                    const int64_t pos = qs.pos + tid * qs.stride;
                    const ra_bwd::brow r = ra_bwd::make_brow(a, h, qr + tid, pos, kp.delta, tid < qt.count, qshift, false);
                    if (FULL_FEATURES) sbrows[b * BQ + tid] = r;
                    else srows[b * BQ + tid] = row_values(r, qt.full && nk == BK ? 0u : ra_fwd::keys_of_row(f, pos, kp.delta, tid < qt.count, kp.ks));
                };
                ra_fwd::run_cursor cur(a.kitems[item]);
                auto next = [&](ra_fwd::key_tile &qt) { return cur.next(f, a.kruns, f.qsegs, BQ, kept, qt); };
                ra_fwd::key_tile qt{};
                bool have = next(qt);
                if (have) issue(qt, 0);
                for (int i = 0; have; ++i) {
                    ra_fwd::key_tile after{};
                    const bool more = next(after);
                    ra_cp_async_wait<0>(); // this tile's Q, dO (and K, V) landed ...
                    __syncthreads();       // ... for every thread; the other buffers are free
                    if (more) issue(after, (i + 1) & 1);
                    const int b = i & 1;
                    const bool full = qt.full && nk == BK;
                    const lane_at ln = ra_fwd::this_lane();
                    // the tile's queries in sub-tiles of QS: S and dP of one take QS / 2
                    // registers each beside dK's and dV's accumulators
                    RA_NO_UNROLL
                    for (int q0 = 0; q0 < BQ; q0 += QS) {
                        const ra_smem<uint16_t> tq = sq + b * BQ * D + q0 * D, tdo = sdo + b * BQ * DV + q0 * DV;
                        // S^T = K Q^T, dP^T = V dO^T: the forward's scores with the warp's 16
                        // keys as its rows (A, read at each k-step) and the queries as its keys
                        float s[1][QS / 8][4], dp[1][QS / 8][4];
                        uint32_t unused[1][1][4];
                        ra_fwd::scores<BF16, D, 1, QS, 0>(sk, tq, ln, unused, s);
                        ra_fwd::scores<BF16, DV, 1, QS, 0>(sv, tdo, ln, unused, dp);
                        if (FULL_FEATURES) {
                            const key_place kp = place_of(a, item);
                            feature_grads<QS>(a, ln, sbrows + b * BQ + q0, full, kp.ks.pos, kp.ks.stride,
                                              kp.kseg.row + a.kitems[item].first, nk, s, dp, db);
                        } else {
                            plain_grads<QS>(ln, srows + b * BQ + q0, full, ldexpf(f.scale, qshift), s, dp);
                        }
                        store_dz<BF16, QS>(sdz + q0 * BK, ln, dp); // before the split takes dZ's rounding
                        ra_fwd::accumulate_pv<BF16, 1, QS, DV>(f.split_p != 0, tdo, ln, s, dv);
                        ra_fwd::accumulate_pv<BF16, 1, QS, D>(f.split_p != 0, tq, ln, dp, dk);
                        if (f.split_p) store_dz<BF16, QS>(sdz_lost + q0 * BK, ln, dp); // what it lost
                    }
                    float *const dq = a.dq_slices + (((int64_t)blockIdx.x * f.heads + h) * f.tq +
                                                     f.qsegs[qt.seg].row + qt.k0) * f.d;
                    __syncthreads();
                    add_dq<BF16, D>(sdz, sk, ln, dq, f.d, qt.count);
                    if (f.split_p) add_dq<BF16, D>(sdz_lost, sk, ln, dq, f.d, qt.count); // SPEC 9 high
                    qt = after, have = more;
                }
            }
            // dK = scale dZ^T Q (Q unshifted), dV = P^T dO: this kv head's rows of the key tile
            const lane_at ln = ra_fwd::this_lane();
            const int64_t krow = place_of(a, item).krow;
            store_key_rows<D>(a, ln, a.dk, krow, a.dk_row, nk, f.d, f.scale, dk, g * a.dk_head);
            store_key_rows<DV>(a, ln, a.dv, krow, a.dv_row, nk, f.dv, 1.0f, dv, g * a.dv_head);
        }
        if (FULL_FEATURES) flush_dbias();
    }
    ra_cp_async_wait<0>();
}
// dQ (SPEC 7) = scale 2^qshift times the sum of the slices' copies, in slice order: stored in the
// storage dtype or added to float32 sums. Grid-stride over [H][T_q][d].
__global__ void __launch_bounds__(256) ra_bwd_dq_sum_kernel(ra_bwd_args a)
{
    const ra_attn_args &f = a.f;
    const int64_t n = (int64_t)f.heads * f.tq * f.d;
    const float scale = ldexpf(f.scale, ra_fwd::q_shift(f));
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < a.slices; ++s) {
            ra_count_global_load(a.dq_slices + s * n + i, 4);
            sum += a.dq_slices[s * n + i];
        }
        const int64_t hr = i / f.d, h = hr / f.tq, r = hr % f.tq;
        ra_bwd::store(a.dq, r * a.dq_row + h * a.dq_head + i % f.d, scale * sum, a.dtype, a.accumulate);
    }
}
