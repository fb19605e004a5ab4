// The backward on tensor cores for bf16 and f16 storage (SPEC 7; DESIGN: CUDA: the backend),
// FlashAttention 2's key-major form: a block owns a tile of 64 keys of a kv head, keeps dK and
// dV in float32 registers, and walks the query tiles of 64 rows its mask allows (the key-major
// tile list, EMPTY tiles not listed), for every query head of the kv head's GQA group in order.
// Its 8 warps are 4 key groups x 2 halves (backward_tc_warp.cuh). Per query tile, by mma.sync
// m16n8k16 from ldmatrix fragments:
//   each warp: S^T = K Q^T and dP^T = V dO^T of its 16 keys and its half's 32 queries (K, V as
//   A fragments, Q, dO as B: the forward's scores), P and dS = P (dP - D_i) in registers (SPEC
//   7; dZ = dS times the softcap's derivative), P and dZ to key-major shared tiles, rounded to
//   the storage dtype at SPEC 9's default level (two 16-bit parts at the high level);
//   then, from those tiles, over all 64 queries: dV += P^T dO and dK += dZ^T Q for the warp's
//   keys and half of the columns (dO and Q by ldmatrix.trans), and dQ += dZ K for query group
//   kg's rows and half of the columns (dZ and K by ldmatrix.trans), added to the slice's
//   float32 copy of dQ: S and dP are computed once (5 products, no second pass).
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

#include "kernels/cuda/backward_tc_warp.cuh"

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
// bias head shared by kv heads one block owns its dBias rows); 8 warps, CTAS blocks an SM
// (backward_tc.cu chooses): two at 128 registers (the plain kernel at head dims up to 128, Q and
// dO single-buffered, S^T and dQ in parts of 16), else one at 255 (the feature kernel at 128
// registers spills 224 bytes; FlashAttention 2's backward at head dim 128 is one block of 8
// warps an SM).
template <bool BF16, int D, int DV, bool FULL_FEATURES, int QBUF, int CTAS>
__global__ void __launch_bounds__(ra_bwd_tc::THREADS, CTAS) ra_bwd_tc_kernel(ra_bwd_args a)
{
    using namespace ra_bwd_tc;
    using L = layout<D, DV, FULL_FEATURES, QBUF>;
    // registers beside dK's and dV's accumulators (128 at D = D_v = 256): the warp's queries of
    // S^T and dP^T, and dQ's columns, at a time
    constexpr int QS = CTAS == 2 || D + DV > 256 ? 16 : HALF_Q, DQ_COLS = QS == 16 ? 16 : 32;
    RA_DYNAMIC_SMEM(uint16_t, sm);
    const ra_smem<uint16_t> sk = sm + L::K, sv = sm + L::V, sq = sm + L::Q, sdo = sm + L::DO,
                            sp = sm + L::P, sdz = sm + L::DZ, sp_lost = sm + L::LOST,
                            sdz_lost = sp_lost + BK * BQ;
    const ra_smem<ra_f32x4> srows = ra_smem_as<ra_f32x4>(sm + L::ROWS);
    const ra_smem<ra_bwd::brow> sbrows = ra_smem_as<ra_bwd::brow>(sm + L::ROWS);
    const ra_smem<float> sdb = ra_smem_as<float>(sm + L::DB);
    const ra_smem<ra_fwd::key_tile> stiles = ra_smem_as<ra_fwd::key_tile>(sm + L::TILES);
    const ra_smem<ra_fwd::run_cursor> scursor = ra_smem_as<ra_fwd::run_cursor>(sm + L::TILES + 16);
    const ra_attn_args &f = a.f;
    const int gb = gridDim.y == 1 ? f.kv_heads : 1;
    const int qshift = ra_fwd::q_shift(f), tid = (int)threadIdx.x;
    const bool split = f.split_p != 0;
    for (int item = (int)blockIdx.x; item < a.key_items; item += (int)gridDim.x) {
        const int nk = (int)place_of(a, item).ks.count;
        float db[2] = {0.0f, 0.0f}; // dBias of the warp's keys g, g + 8 over its half, bias head hb_open
        int hb_open = -1;
        auto flush_dbias = [&]() { // the halves' sums added in half order
            const lane_at ln = ra_fwd::this_lane(), kl = key_group(ln);
            const int64_t krow = place_of(a, item).krow;
            __syncthreads(); // a previous flush has read sdb
            RA_UNROLL
            for (int hh = 0; hh < 2; ++hh)
                if (ln.warp >= 4 && ln.t == 0) sdb[kl.warp * 16 + kl.g + 8 * hh] = db[hh];
            __syncthreads();
            RA_UNROLL
            for (int hh = 0; hh < 2; ++hh) {
                const int j = kl.warp * 16 + kl.g + 8 * hh;
                if (hb_open >= 0 && a.dbias && ln.warp < 4 && ln.t == 0 && j < nk)
                    ra_bwd::store(a.dbias, (int64_t)hb_open * f.bias_ld + krow + j, db[hh] + sdb[j], 0, a.accumulate);
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
            float dk[1][D / 16][4], dv[1][DV / 16][4]; // the warp's keys, half of the columns
            RA_UNROLL
            for (int n = 0; n < D / 16; ++n)
                RA_UNROLL
                for (int c = 0; c < 4; ++c) dk[0][n][c] = 0.0f;
            RA_UNROLL
            for (int n = 0; n < DV / 16; ++n)
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
                // Q and dO of a query tile into their buffer b (one cp.async group), its rows
                // into theirs, rb (double-buffered either way)
                auto issue = [&](const ra_fwd::key_tile &qt, int b, int rb) {
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
                    if (FULL_FEATURES) sbrows[rb * BQ + tid] = r;
                    else srows[rb * BQ + tid] = row_values(r, qt.full && nk == BK ? 0u : ra_fwd::keys_of_row(f, pos, kp.delta, tid < qt.count, kp.ks));
                };
                ra_fwd::run_cursor cur(a.kitems[item]);
                auto next = [&](ra_fwd::key_tile &qt) { return cur.next(f, a.kruns, f.qsegs, BQ, kept, qt); };
                ra_fwd::key_tile first{};
                bool have = next(first);
                if (tid == 0) scursor[0] = cur;
                __syncthreads(); // every warp is past the previous head's last dV and dK (its Q, dO)
                if (have) issue(first, 0, 0);
                if (have && tid == 0) stiles[0] = first;
                for (int i = 0; have; ++i) {
                    ra_fwd::key_tile after{};
                    cur = scursor[0];
                    const bool more = next(after);
                    ra_cp_async_wait<0>(); // this tile's Q, dO (and K, V) landed ...
                    __syncthreads();       // ... for every thread; the other buffers are free
                    if (QBUF == 2 && more) issue(after, (i + 1) & 1, (i + 1) & 1);
                    if (tid == 0) { // the block's place, in shared memory rather than registers
                        stiles[(i + 1) & 1] = more ? after : ra_fwd::key_tile{-1, 0, 0, false};
                        scursor[0] = cur;
                    }
                    const ra_fwd::key_tile qt = stiles[i & 1];
                    const int b = QBUF == 2 ? i & 1 : 0, rb = i & 1;
                    const bool full = qt.full && nk == BK;
                    const lane_at ln = opaque_lane(), kl = key_group(ln);
                    const int half = ln.warp / 4;
                    const ra_smem<uint16_t> tq = sq + b * BQ * D, tdo = sdo + b * BQ * DV;
                    // S^T = K Q^T, dP^T = V dO^T of the warp's keys and its half's queries: the
                    // forward's scores with the keys as its rows and the queries as its keys
                    RA_NO_UNROLL
                    for (int q0 = half * HALF_Q; q0 < (half + 1) * HALF_Q; q0 += QS) {
                        float s[1][QS / 8][4], dp[1][QS / 8][4];
                        uint32_t unused[1][1][4];
                        ra_fwd::scores<BF16, D, 1, QS, 0>(sk, tq + q0 * D, kl, unused, s);
                        ra_fwd::scores<BF16, DV, 1, QS, 0>(sv, tdo + q0 * DV, kl, unused, dp);
                        if (FULL_FEATURES) {
                            const key_place kp = place_of(a, item);
                            feature_grads<QS>(a, kl, sbrows + rb * BQ + q0, full, kp.ks.pos, kp.ks.stride,
                                              kp.kseg.row + a.kitems[item].first, nk, s, dp, db);
                        } else {
                            plain_grads<QS>(kl, srows + rb * BQ + q0, full, ldexpf(f.scale, qshift), s, dp);
                        }
                        store_pairs<BF16, QS>(sp, sp_lost, split, kl, q0, s);
                        store_pairs<BF16, QS>(sdz, sdz_lost, split, kl, q0, dp);
                    }
                    __syncthreads(); // every warp's P and dZ
                    add_key_rows<BF16, DV, DV / 2>(sp, tdo, kl, half * (DV / 2), dv);
                    if (split) add_key_rows<BF16, DV, DV / 2>(sp_lost, tdo, kl, half * (DV / 2), dv);
                    add_key_rows<BF16, D, D / 2>(sdz, tq, kl, half * (D / 2), dk);
                    if (split) add_key_rows<BF16, D, D / 2>(sdz_lost, tq, kl, half * (D / 2), dk);
                    if (QBUF == 1) { // every warp is done with Q and dO: the next tile's load
                        __syncthreads(); // runs during dQ
                        const ra_fwd::key_tile nx = stiles[(i + 1) & 1];
                        if (nx.seg >= 0) issue(nx, 0, (i + 1) & 1);
                    }
                    const ra_fwd::key_tile tile = stiles[i & 1];
                    float *const dq = a.dq_slices + (((int64_t)blockIdx.x * f.heads + h) * f.tq +
                                                     f.qsegs[tile.seg].row + tile.k0) * f.d;
                    add_dq<BF16, D, DQ_COLS>(sdz, sk, kl, half * (D / 2), dq, f.d, tile.count);
                    if (split) add_dq<BF16, D, DQ_COLS>(sdz_lost, sk, kl, half * (D / 2), dq, f.d, tile.count); // SPEC 9 high
                    const ra_fwd::key_tile coming = stiles[(i + 1) & 1];
                    have = coming.seg >= 0;
                }
            }
            // dK = scale dZ^T Q (Q unshifted), dV = P^T dO: this kv head's rows of the key tile
            const lane_at ln = ra_fwd::this_lane(), kl = key_group(ln);
            const int half = ln.warp / 4;
            const int64_t krow = place_of(a, item).krow;
            store_key_rows<D / 2>(a, kl, a.dk, krow, a.dk_row, nk, half * (D / 2), f.d, f.scale, dk, g * a.dk_head);
            store_key_rows<DV / 2>(a, kl, a.dv, krow, a.dv_row, nk, half * (DV / 2), f.dv, 1.0f, dv, g * a.dv_head);
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
