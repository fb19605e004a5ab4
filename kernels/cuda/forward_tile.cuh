// The forward kernel on tensor cores (DESIGN: CUDA: the backend; FlashAttention 2's structure),
// bf16 or f16 storage. One block per item of the plan's tile list (a query tile of BQ rows,
// heaviest first) and head; 4 warps of MT m-tiles of 16 rows each, so that every K and V
// fragment feeds MT m-tiles (MT = 2: 128 rows). Q, K, V in dynamic shared memory in 16-byte
// chunks swizzled by `chunk ^ (row % 8)`, loaded by cp.async with zero fill; K and V
// double-buffered (V single-buffered where two CTAs an SM need it: VBUF): at the top of each key
// tile one wait and one barrier, then the next tile's K and V are issued into the other buffers
// and land while this one computes S = Q K^T (ldmatrix + mma.m16n8k16), SPEC 4's guarded
// update in registers (row max and sum over the quad by __shfl_xor_sync 1, 2), and acc += P V
// with P's accumulators packed to 16 bits as the A fragments and V through ldmatrix.trans.
//
// Compile time: the dtype and the feature set. The plain kernel (no softcap, ALiBi or key bias)
// takes each row's max of the raw products, its max logit m (times cn = scale 2^shift) and
// p = 2^(z c - m log2(e)), c = cn log2(e): one FFMA and one MUFU.EX2 per element (rows whose
// logits are far from 0 take the rounded logit minus m first: SPEC 10 case 4). FULL tiles (the
// list's kind) run no per-element mask; a PARTIAL tile's mask is a pass of its own, each key's
// index against its row's interval found once per row and tile. The FULL_FEATURES kernel (64
// rows) computes SPEC 2's logit per element (softcap, ALiBi, SPEC 6 bias and top-k:
// forward_common.cuh's logit). SPEC 9's Q shift (decided on the device from the call's scan)
// scales the Q tile once and folds 2^shift into c. The accumulators are rescaled only where a
// row's max changed (exactly as SPEC 4 asks: alpha = 1). Registers go to the accumulators and S:
// the rows' sums and key intervals take a register each (one row's a lane), nothing calls a
// slow path (a call would spill), and what a tile needs of the block's place is loaded when it
// needs it; a warp whose rows have no key in a PARTIAL tile skips it. One ring step per launch:
// the running state (m, l, acc) is float32 in device memory between steps, m in logit units,
// bit for bit the kernel's own; the last step writes O (through shared memory, in 16-byte
// stores) and LSE.
#pragma once

#include "kernels/cuda/forward_tile_softmax.cuh"

namespace ra_fwd {

// The A fragment of Q for k-step kk (16 columns) of the 16 rows from tile row r0.
template <int D>
__device__ __forceinline__ void q_fragment(ra_smem<uint16_t> sq, const lane_at &ln, int r0, int kk,
                                           uint32_t f[4])
{
    const int qm = ln.lane >> 3, qr = ln.lane & 7;
    ra_ldmatrix_x4(false, f, sq + swz<D>(r0 + (qm & 1) * 8 + qr, kk * 16 + (qm >> 1) * 8));
}

// S += Q K^T of k-step kk (16 columns) for the warp's MT m-tiles and the tile's BK keys (BK / 8
// n-tiles of 8), each K fragment feeding every m-tile; qa: Q's A fragments of the k-step.
template <bool BF16, int D, int MT, int BK>
__device__ __forceinline__ void scores_step(ra_smem<uint16_t> sk, const lane_at &ln, int kk,
                                            const uint32_t (*qa)[4], float (&s)[MT][BK / 8][4])
{
    RA_UNROLL
    for (int np = 0; np < BK / 16; ++np) {
        uint32_t kb[4];
        const int bm = ln.lane >> 3, br = ln.lane & 7;
        ra_ldmatrix_x4(false, kb, sk + swz<D>(np * 16 + (bm >> 1) * 8 + br, kk * 16 + (bm & 1) * 8));
        RA_UNROLL
        for (int mt = 0; mt < MT; ++mt) {
            ra_mma_16816(BF16, s[mt][2 * np], qa[mt], kb, s[mt][2 * np]);
            ra_mma_16816(BF16, s[mt][2 * np + 1], qa[mt], kb + 2, s[mt][2 * np + 1]);
        }
    }
}

// S = Q K^T of the warp's rows and the tile's keys, Q's fragments of the last QK k-steps from
// registers (qf, loaded once: QK = D / 16 all of them, 1 or 0) and the others read from shared
// memory at each k-step of a loop kept rolled, so that only one k-step's fragments take
// registers beside the accumulators and S. In k-step order either way: S's bits do not depend
// on QK.
template <bool BF16, int D, int MT, int BK, int QK>
__device__ __forceinline__ void scores(ra_smem<uint16_t> sq, ra_smem<uint16_t> sk,
                                       const lane_at &ln, const uint32_t (&qf)[QK > 0 ? QK : 1][MT][4],
                                       float (&s)[MT][BK / 8][4])
{
    static_assert(QK == 0 || QK == 1 || QK == D / 16, "Q held: all k-steps, the last or none");
    RA_UNROLL
    for (int mt = 0; mt < MT; ++mt)
        RA_UNROLL
        for (int n = 0; n < BK / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 4; ++c) s[mt][n][c] = 0.0f;
    if constexpr (QK == D / 16) {
        RA_UNROLL
        for (int kk = 0; kk < QK; ++kk) scores_step<BF16, D, MT, BK>(sk, ln, kk, qf[kk], s);
    } else {
        RA_NO_UNROLL
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t qa[MT][4];
            RA_UNROLL
            for (int mt = 0; mt < MT; ++mt) {
                if (kk >= D / 16 - QK)
                    RA_UNROLL
                    for (int r = 0; r < 4; ++r) qa[mt][r] = qf[0][mt][r];
                else
                    q_fragment<D>(sq, ln, (ln.warp * MT + mt) * 16, kk, qa[mt]);
            }
            scores_step<BF16, D, MT, BK>(sk, ln, kk, qa, s);
        }
    }
}

// acc += P V for keys [16 j, 16 j + 16) of the tile: P's A fragments pa, V as B through
// ldmatrix.trans, each V fragment feeding every m-tile; o holds V's N columns from c0 (all of
// its DV unless a caller takes them in parts).
template <bool BF16, int MT, int DV, int N = DV>
__device__ __forceinline__ void pv_step(ra_smem<uint16_t> sv, const lane_at &ln, int j,
                                        const uint32_t (&pa)[MT][4], float (&o)[MT][N / 8][4],
                                        int c0 = 0)
{
    RA_UNROLL
    for (int dp = 0; dp < N / 16; ++dp) {
        uint32_t vb[4];
        const int bm = ln.lane >> 3, br = ln.lane & 7;
        ra_ldmatrix_x4(true, vb, sv + swz<DV>(j * 16 + (bm & 1) * 8 + br, c0 + dp * 16 + (bm >> 1) * 8));
        RA_UNROLL
        for (int mt = 0; mt < MT; ++mt) {
            ra_mma_16816(BF16, o[mt][2 * dp], pa[mt], vb, o[mt][2 * dp]);
            ra_mma_16816(BF16, o[mt][2 * dp + 1], pa[mt], vb + 2, o[mt][2 * dp + 1]);
        }
    }
}

// acc += P V: P's accumulators are the A fragments, rounded to 16 bits (SPEC 9's default level,
// as FlashAttention rounds them). At the high level (split) P goes in two 16-bit parts, the
// rounded P and then what its rounding lost, so that O carries no rounding of P beyond a plain
// float32 implementation's; one part's fragments live at a time (V's fragments are loaded
// twice then), which keeps the D = D_v = 128 kernel within the register file.
template <bool BF16, int MT, int BK, int DV>
__device__ __forceinline__ void accumulate_pv(bool split, ra_smem<uint16_t> sv, const lane_at &ln,
                                              float (&s)[MT][BK / 8][4],
                                              float (&o)[MT][DV / 8][4])
{
    RA_UNROLL
    for (int j = 0; j < BK / 16; ++j) {
        uint32_t pa[MT][4];
        if (split) {
            RA_UNROLL
            for (int mt = 0; mt < MT; ++mt)
                RA_UNROLL
                for (int f = 0; f < 4; ++f) // fragment f: n-tile 2j + f / 2, rows 2 (f % 2) + {0, 1}
                    pa[mt][f] = split_p<BF16>(s[mt][2 * j + f / 2][2 * (f % 2)],
                                              s[mt][2 * j + f / 2][2 * (f % 2) + 1]);
            pv_step<BF16, MT, DV>(sv, ln, j, pa, o);
        }
        RA_UNROLL
        for (int mt = 0; mt < MT; ++mt)
            RA_UNROLL
            for (int f = 0; f < 4; ++f)
                pa[mt][f] = ra_pack_16x2(BF16, s[mt][2 * j + f / 2][2 * (f % 2)],
                                         s[mt][2 * j + f / 2][2 * (f % 2) + 1]);
        pv_step<BF16, MT, DV>(sv, ln, j, pa, o);
    }
}

// The rows' state at the end of the step: kept for the next one in device memory (m in logit
// units, the quad's sum), or finalised (SPEC 4, softmax_state.h: an empty row gives O = 0 and
// LSE = -inf). O goes through shared memory (so, free once the loop is done) to 16-byte stores
// of whole rows, 16-byte aligned O permitting.
template <bool BF16, int BQ, int MT, int DV>
__device__ __forceinline__ void store_state(const ra_attn_args &a, const block_at &b,
                                            const lane_at &ln, rows_state<MT, DV> &st,
                                            ra_smem<uint16_t> so)
{
    const ra_smem<uint32_t> so32 = ra_smem_as<uint32_t>(so);
    RA_UNROLL
    for (int mt = 0; mt < MT; ++mt)
        RA_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
            const float l = st.sum_of(ln, mt, hh), m = st.m[mt][hh]; // before any lane leaves
            const int row = tile_row<MT>(ln, mt, hh);
            const int64_t at = (int64_t)b.h * a.tq + b.first_row + row;
            if (!a.last) {
                if (row >= b.rows) continue;
                if (ln.t == 0) a.m[at + b.zstate] = m, a.l[at + b.zstate] = l;
                RA_UNROLL
                for (int n = 0; n < DV / 8; ++n)
                    RA_UNROLL
                    for (int c = 0; c < 2; ++c) {
                        const int col = n * 8 + 2 * ln.t + c;
                        if (col < b.dv) a.acc[at * a.dv + b.v0 + col] = st.o[mt][n][2 * hh + c];
                    }
                continue;
            }
            float inv = l == 0.0f ? 0.0f : ra_rcp(l); // ra__state_out_scale, one MUFU
            const float lse = a.sinks ? ra__state_lse_sink(m, l, a.sinks[b.h], &inv)
                                      : ra__state_lse(m, l);
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                so32[swz<DV>(row, n * 8 + 2 * ln.t) / 2] =
                    ra_pack_16x2(BF16, st.o[mt][n][2 * hh] * inv, st.o[mt][n][2 * hh + 1] * inv);
            if (ln.t == 0 && b.owner && row < b.rows) {
                ra_count_global_store(a.lse + at, 4);
                a.lse[at] = lse;
            }
        }
    if (!a.last) return;
    __syncthreads();
    uint16_t *o = static_cast<uint16_t *>(a.o) + b.v0 + b.first_row * a.o_row + (int64_t)b.h * a.o_head;
    const bool wide = ((uintptr_t)o & 15) == 0 && a.o_row % 8 == 0; // 16-byte stores
    const ra_smem<ra_u32x4> so128 = ra_smem_as<ra_u32x4>(so);
    for (int c = (int)threadIdx.x; c < BQ * (DV / 8); c += (int)blockDim.x) {
        const int r = c / (DV / 8), ch = c % (DV / 8);
        if (r >= b.rows || ch * 8 >= b.dv) continue;
        const ra_u32x4 v = so128[swz<DV>(r, ch * 8) / 8];
        uint16_t *dst = o + r * a.o_row + ch * 8;
        if (wide) {
            ra_count_global_store(dst, 16);
            *reinterpret_cast<ra_u32x4 *>(dst) = v;
            continue;
        }
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        RA_UNROLL
        for (int e = 0; e < 8; ++e) {
            ra_count_global_store(dst + e, 2);
            dst[e] = (uint16_t)(w[e / 2] >> (16 * (e % 2)));
        }
    }
}

} // namespace ra_fwd

// Grid: (the tile list's query tiles, heads, blocks over D_v); 128 threads, two blocks per SM.
// BF16: bfloat16 storage, else float16; FULL_FEATURES: softcap, ALiBi or a key bias. Through
// the key loop the block keeps only the accumulators, S, the rows' max and sum, and the walk's
// place: what else a tile needs is loaded when it needs it (registers: at D = D_v = 128 the
// accumulators and S alone are 192 of 255).
// VBUF: V's buffers. Two: one wait and one barrier a tile, K and V of the next tile in flight
// through all of this one. One (FlashAttention 2's pipeline, for an A100's 164 KiB: two CTAs of
// 80 KiB at D = D_v = 128 where two of 96 do not fit): V's copy issued at the top of its own
// tile, in flight during S and the softmax, and a second wait and barrier before P V.
template <bool BF16, int D, int DV, bool FULL_FEATURES, int VBUF>
__global__ void __launch_bounds__(128, 2) ra_fwd_tile_kernel(ra_attn_args a)
{
    using namespace ra_fwd;
    using S = tc_shape<D, DV, FULL_FEATURES>;
    constexpr int BQ = S::BQ, BK = S::BK, MT = S::MT;
    static_assert(D % 16 == 0 && D <= 256 && DV % 16 == 0 && DV <= 128, "instantiated head dims");
    static_assert(VBUF == 1 || VBUF == 2, "V single- or double-buffered");
    RA_DYNAMIC_SMEM(uint16_t, sm);
    const ra_smem<uint16_t> sq = sm, sk = sm + BQ * D, sv = sk + 2 * BK * D;
    const int qshift = q_shift(a);
    const score_scale sc = scale_of<FULL_FEATURES>(a, qshift);
    {
        const block_at b = this_block<BQ, DV>(a);
        load_tile<D>(sq, static_cast<const uint16_t *>(a.q) + b.first_row * a.q_row + b.h * a.q_head,
                     a.q_row, 0, b.rows, BQ, a.d);
        ra_cp_async_commit();
    }
    rows_state<MT, DV> st;
    float tmin = INFINITY; // with a top-k selection: the block's smallest threshold
    const float *brow = nullptr;
    {
        const block_at b = this_block<BQ, DV>(a);
        const lane_at ln = this_lane();
        load_state<MT, DV>(a, b, ln, st);
        if (FULL_FEATURES && a.thr_b) {
            RA_UNROLL
            for (int mt = 0; mt < MT; ++mt)
                RA_UNROLL
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = tile_row<MT>(ln, mt, hh);
                    const row_ctx rc = make_row(a, b.h, b.first_row + row, 0, b.delta, row < b.rows, 0);
                    tmin = fminf(tmin, rc.tb);
                    brow = rc.bias;
                }
            tmin = block_min<S::WARPS>(tmin);
        }
    }
    const topk_kept kept{brow, tmin}; // the plain kernel has no selection: keeps every tile
    run_cursor keys(a.items[blockIdx.x]);
    auto next_tile = [&](key_tile &kt) {
        if (!FULL_FEATURES)
            return keys.next(a, a.runs, a.ksegs, BK, [](const ra_segment &, int, int) { return true; }, kt);
        return keys.next(a, a.runs, a.ksegs, BK, kept, kt);
    };
    // K or V of a key tile into buffer `buf`, one cp.async group each
    auto issue = [&](const key_tile &kt, int buf, bool k, bool v) {
        const int hk = (int)blockIdx.y / (a.heads / a.kv_heads), v0 = (int)blockIdx.z * DV;
        const ra_segment kseg = a.ksegs[kt.seg];
        if (k) {
            load_tile<D>(sk + buf * BK * D,
                         static_cast<const uint16_t *>(a.k) + kseg.row * a.k_row + hk * a.k_head, a.k_row,
                         kt.k0, (int)kseg.span.count, BK, a.d);
            ra_cp_async_commit();
        }
        if (v) {
            load_tile<DV>(sv + buf * BK * DV, // buf 0 with one V buffer
                          static_cast<const uint16_t *>(a.v) + kseg.row * a.v_row + hk * a.v_head + v0,
                          a.v_row, kt.k0, (int)kseg.span.count, BK, a.dv - v0 < DV ? a.dv - v0 : DV);
            ra_cp_async_commit();
        }
    };
    key_tile kt{};
    bool have = next_tile(kt);
    if (have) issue(kt, 0, true, VBUF == 2);
    if (have) // Q landed (the first tile's K and V may still be in flight)
        ra_cp_async_wait<VBUF>();
    else
        ra_cp_async_wait<0>();
    __syncthreads();
    if (qshift) { // uniform: the whole call's inputs decide it
        shift_tile(sq, BQ * D, qshift);
        __syncthreads();
    }
    uint32_t qf[S::QK > 0 ? S::QK : 1][MT][4]; // Q's fragments held through the loop (tc_shape::QK)
    {
        const lane_at ln = this_lane();
        RA_UNROLL
        for (int kk = 0; kk < S::QK; ++kk)
            RA_UNROLL
            for (int mt = 0; mt < MT; ++mt)
                q_fragment<D>(sq, ln, (ln.warp * MT + mt) * 16, S::QK == D / 16 ? kk : D / 16 - 1, qf[kk][mt]);
    }
    for (int i = 0; have; ++i) {
        key_tile next{};
        const bool more = next_tile(next);
        ra_cp_async_wait<0>(); // this tile's K (and V, if double-buffered) landed ...
        __syncthreads();       // ... for every thread, and the other buffers are free
        if (VBUF == 1) issue(kt, 0, false, true);
        if (more) issue(next, (i + 1) & 1, true, VBUF == 2);
        if (VBUF == 1 && !more) ra_cp_async_commit(); // an empty group: V's is then the second-last
        const lane_at ln = this_lane();
        const bool any = tile_bounds<BQ, MT, BK, DV>(a, ln, kt, st); // before S takes its registers
        float s[MT][BK / 8][4]; // the warp's rows x the tile's keys
        auto scores_softmax = [&] {
            scores<BF16, D, MT, BK, S::QK>(sq, sk + (i & 1) * BK * D, ln, qf, s);
            softmax_update<FULL_FEATURES, BQ, MT, BK, DV>(a, ln, kt, qshift, sc, st, s);
        };
        // V's offset hidden from the compiler with one buffer: its addresses, loop-invariant
        // then, would be hoisted out of the loop into registers that spill
        auto pv = [&] {
            const int v_at = VBUF == 2 ? (i & 1) * BK * DV : ra_opaque(0);
            accumulate_pv<BF16, MT, BK, DV>(a.split_p != 0, sv + v_at, ln, s, st.o);
        };
        if (VBUF == 2 && any) scores_softmax(), pv();
        if (VBUF == 1) { // the warps that skip the tile still meet the barrier
            if (any) scores_softmax();
            ra_cp_async_wait<1>(); // V landed (the next K may be in flight) ...
            __syncthreads();       // ... for every thread
            if (any) pv();
        }
        kt = next, have = more;
    }
    __syncthreads(); // the epilogue reuses the shared memory (every copy was waited for)
    store_state<BF16, BQ, MT, DV>(a, this_block<BQ, DV>(a), this_lane(), st, sm);
}

// Shared memory of ra_fwd_tile_kernel<*, D, DV, FULL_FEATURES, VBUF>: Q, K twice, V VBUF times.
constexpr size_t ra_fwd_tile_smem(int d, int dv, bool full_features, int vbuf)
{
    return ((size_t)ra__cuda_query_tile(d, full_features) * d +
            (size_t)ra__cuda_keys_per_tile(d) * (2 * d + vbuf * dv)) * 2;
}

// The single-V pipeline is instantiated where an A100 needs it for two CTAs an SM: D = D_v = 128
// plain (forward_tile.cu launches it where two double-buffered CTAs do not fit an SM).
constexpr bool ra_fwd_tile_has_one_v(int d, int dv, bool full_features)
{
    return d == 128 && dv == 128 && !full_features;
}

// ra_fwd_tile_kernel<BF16, D, DV, FULL, vbuf> on stream s (vbuf 1 where that kernel exists, else
// V double-buffered): 0 or a cudaError_t.
template <bool BF16, int D, int DV, bool FULL>
int ra_fwd_tile_launch(const ra_attn_args &a, dim3 grid, cudaStream_t s, int vbuf)
{
    int st;
    if constexpr (ra_fwd_tile_has_one_v(D, DV, FULL))
        if (vbuf == 1) {
            RA_LAUNCH(st, (ra_fwd_tile_kernel<BF16, D, DV, FULL, 1>), grid, dim3(128),
                      ra_fwd_tile_smem(D, DV, FULL, 1), s, a);
            return st;
        }
    RA_LAUNCH(st, (ra_fwd_tile_kernel<BF16, D, DV, FULL, 2>), grid, dim3(128),
              ra_fwd_tile_smem(D, DV, FULL, 2), s, a);
    return st;
}
