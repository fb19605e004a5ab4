// The forward kernel's core (DESIGN: CUDA: the backend; FlashAttention 2's structure), bf16/f16
// storage: one block per (query tile of 64 rows, head); 4 warps of 16 rows; Q, K, V tiles in
// dynamic shared memory in 16-byte chunks swizzled by `chunk ^ (row % 8)`, loaded by cp.async with
// zero fill past the end; S = Q K^T by mma.m16n8k16 from ldmatrix fragments; the SPEC 4 guarded
// update of kernels/softmax_state.h in registers, row max and sum over the quad by __shfl_xor_sync
// 1 and 2; P's accumulators packed to 16 bits are the A fragments of P V; V as B through
// ldmatrix.trans. One ring step per launch: the running state (m, l, acc) of SPEC 4 is float32 in
// device memory between steps; the last step writes O and LSE.
//
// Tokens as the CPU backend sees them (masks/shard.h): the local queries and the held key
// shard are segments -- a span of one sequence (positions pos, pos + stride, ...) at a local
// row -- so every layout of SPEC 8 (contiguous, zigzag, striped) and packed variable-length
// batches take one path. One block per (query tile of a query segment, head): the host lists
// the tiles (work); for each key segment of the same sequence the block walks only the key
// tiles inside the window's hull (masks/mask.h, shared with the CPU; EMPTY tiles skipped
// exactly; FULL tiles take no per-element mask). SPEC 2's scale, softcap, ALiBi, the SPEC 6 key
// bias and top-k thresholds (tiles no row keeps skipped), GQA, D != D_v, and head dims below
// the tile's (D, DV) as zero columns, so one instantiation serves e.g. 80 in a 96 tile.
#pragma once

#include "kernels/cuda/forward_common.cuh"

namespace ra_fwd {

// D up to 256; the DV tile up to 128 (at 256 the P V accumulators alone would fill the register
// file: D_v = 256 runs as two blocks of 128 columns, forward_common.cuh)
constexpr int BQ = 64, WARPS = 4;

// The swizzled address of 16-bit element (row, col) of a tile of D columns: 16-byte chunks
// permuted within each group of 8 by chunk ^ (row % 8) (a tail group of 4 or 2 chunks, as at
// D = 96 or 80, by row % 4 or % 2), so that ldmatrix's 8 rows hit distinct banks.
template <int D> __device__ __forceinline__ int swz(int row, int col)
{
    constexpr int chunks = D / 8;
    const int chunk = col / 8, group = chunk & ~7;
    const int period = chunks - group < 8 ? chunks - group : 8;
    return row * D + ((group + ((chunk - group) ^ (row % period))) * 8) + col % 8;
}

// Rows [r0, r0 + n) of a sequence (base: its first row of a [T, heads, dim] tensor, at the
// head) into a swizzled tile of D >= dim columns; zeros at and past `rows`, the sequence's
// length, and in the columns past dim.
template <int D>
__device__ __forceinline__ void load_tile(ra_smem<uint16_t> tile, const uint16_t *base,
                                          int64_t row_stride, int r0, int rows, int n, int dim)
{
    constexpr int chunks = D / 8;
    for (int c = (int)threadIdx.x; c < n * chunks; c += (int)blockDim.x) {
        const int r = c / chunks, ch = c % chunks, src_row = r0 + r;
        const bool in = src_row < rows && ch * 8 < dim;
        const uint16_t *src = base + (in ? (int64_t)src_row * row_stride + ch * 8 : 0);
        ra_cp_async16(tile + swz<D>(r, ch * 8), src, in);
    }
}

// SPEC 9: the landed bf16 Q tile times 2^-shift, in place (exact: a power of two).
__device__ __forceinline__ void shift_tile(ra_smem<uint16_t> tile, int n, int shift)
{
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x)
        tile[i] = (uint16_t)(ra_pack_16x2(true, ldexpf(__uint_as_float((uint32_t)tile[i] << 16), -shift),
                                          0.0f) & 0xffffu);
}

// Two probabilities as an A-fragment pair rounded to 16 bits; x0 and x1 become what that
// rounding lost (the second part of P, rounded again later: the two carry P to about twice the
// 16-bit precision).
__device__ __forceinline__ uint32_t split_p(bool bf16, float &x0, float &x1)
{
    const uint32_t hi = ra_pack_16x2(bf16, x0, x1);
    const uint16_t h0 = (uint16_t)(hi & 0xffffu), h1 = (uint16_t)(hi >> 16);
    x0 -= bf16 ? ra__bf16_to_f32(h0) : ra__f16_to_f32(h0);
    x1 -= bf16 ? ra__bf16_to_f32(h1) : ra__f16_to_f32(h1);
    return hi;
}

// A lane's place in its block: warp, lane, and the lane's quad coordinates of the mma
// fragments (g: row within an 8-row group, t: column pair).
struct lane_at {
    int lane, warp, g, t;
};

__device__ __forceinline__ lane_at this_lane()
{
    const int lane = (int)threadIdx.x & 31;
    return lane_at{lane, (int)threadIdx.x >> 5, lane >> 2, lane & 3};
}

// The query tile of a block and the D_v columns it owns: its span, first local row and rows,
// its head and kv head, and its block over D_v (blockIdx.z, forward_common.cuh).
template <int DV> struct block_at {
    ra_span tile;
    int64_t first_row, delta, zstate; // zstate: this D_v block's copy of (m, l)
    int rows, h, hk, v0, dv;
    bool owner;                       // writes LSE
};

template <int DV> __device__ __forceinline__ block_at<DV> this_block(const ra_attn_args &a)
{
    block_at<DV> b;
    query_tile(a, (int)blockIdx.x, BQ, &b.tile, &b.first_row);
    b.rows = (int)b.tile.count;
    b.delta = a.delta[b.tile.seq];
    b.h = (int)blockIdx.y, b.hk = b.h / (a.heads / a.kv_heads);
    b.v0 = (int)blockIdx.z * DV, b.dv = a.dv - b.v0 < DV ? a.dv - b.v0 : DV;
    b.owner = blockIdx.z == 0;
    b.zstate = (int64_t)blockIdx.z * a.state_z;
    return b;
}

// The running state of SPEC 4 of a lane's two rows (g, g + 8 of its warp's 16, within the
// tile): their SPEC 2/3/6 context, max, sum and accumulator fragments.
template <int DV> struct rows_state {
    int rows[2];
    row_ctx rc[2];
    float m[2], l[2], acc[DV / 8][4];
};

// The rows' state: carried from the previous ring step (device memory), or fresh.
template <int DV>
__device__ __forceinline__ void load_state(const ra_attn_args &a, const block_at<DV> &b,
                                           const lane_at &ln, int qshift, rows_state<DV> &st)
{
    st.rows[0] = ln.warp * 16 + ln.g, st.rows[1] = ln.warp * 16 + ln.g + 8;
    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int row = st.rows[r];
        const int64_t at = (int64_t)b.h * a.tq + b.first_row + row;
        st.rc[r] = make_row(a, b.h, b.first_row + row, b.tile.pos + row * b.tile.stride, b.delta,
                            row < b.rows, qshift);
        const bool carried = st.rc[r].live && !a.first;
        st.m[r] = carried ? a.m[at + b.zstate] : -INFINITY;
        st.l[r] = carried ? a.l[at + b.zstate] : 0.0f;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 2; ++c) {
                const int col = n * 8 + 2 * ln.t + c;
                st.acc[n][2 * r + c] = carried && col < b.dv ? a.acc[at * a.dv + b.v0 + col] : 0.0f;
            }
    }
}

// The lane's A fragment of Q for k-step kk (16 columns) of its warp's 16 rows.
template <int D>
__device__ __forceinline__ void q_fragment(ra_smem<uint16_t> sq, const lane_at &ln, int kk,
                                           uint32_t f[4])
{
    const int qm = ln.lane >> 3, qr = ln.lane & 7;
    ra_ldmatrix_x4(false, f, sq + swz<D>(ln.warp * 16 + (qm & 1) * 8 + qr, kk * 16 + (qm >> 1) * 8));
}

// S = Q K^T of the warp's 16 rows and the tile's BK keys (BK / 8 n-tiles of 8 keys), from Q's
// fragments in registers (qf) or, with QREG false, in shared memory at each k-step.
template <int D, int BK, bool QREG>
__device__ __forceinline__ void scores(bool bf16, ra_smem<uint16_t> sq, ra_smem<uint16_t> sk,
                                       const lane_at &ln, const uint32_t (*qf)[4],
                                       float s[BK / 8][4])
{
    RA_UNROLL
    for (int n = 0; n < BK / 8; ++n)
        RA_UNROLL
        for (int c = 0; c < 4; ++c) s[n][c] = 0.0f;
    RA_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[4];
        if (!QREG) q_fragment<D>(sq, ln, kk, qa);
        const uint32_t *af = QREG ? qf[QREG ? kk : 0] : qa;
        RA_UNROLL
        for (int np = 0; np < BK / 16; ++np) {
            uint32_t b[4];
            const int bm = ln.lane >> 3, br = ln.lane & 7;
            ra_ldmatrix_x4(false, b, sk + swz<D>(np * 16 + (bm >> 1) * 8 + br, kk * 16 + (bm & 1) * 8));
            ra_mma_16816(bf16, s[2 * np], af, b, s[2 * np]);
            ra_mma_16816(bf16, s[2 * np + 1], af, b + 2, s[2 * np + 1]);
        }
    }
}

// SPEC 3's mask and SPEC 4's guarded update of the lane's two rows by one key tile: S becomes
// P = exp(s - m_new) in place (0 for a row with no allowed key yet, whose state is unchanged),
// l and the accumulators rescaled. Row max and sum reduced over the quad (__shfl_xor 1, 2).
template <int BK, int DV>
__device__ __forceinline__ void softmax_update(const ra_attn_args &a, const key_tile &kt,
                                               const lane_at &ln, rows_state<DV> &st,
                                               float s[BK / 8][4])
{
    const ra_segment &kseg = kt.seg;
    const int k0 = kt.k0, lk = (int)kseg.span.count;
    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        float mb = -INFINITY;
        RA_UNROLL
        for (int n = 0; n < BK / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 2; ++c) {
                float &x = s[n][2 * r + c];
                const int kj = k0 + n * 8 + 2 * ln.t + c;
                const int64_t pj = kseg.span.pos + (int64_t)kj * kseg.span.stride;
                x = kt.full ? logit<false>(a, st.rc[r], x, true, pj, kseg.row + kj)
                            : logit<true>(a, st.rc[r], x, kj < lk, pj, kseg.row + kj);
                mb = ra__max_nan(x, mb); // SPEC 9: a NaN row stays NaN
            }
        mb = ra__max_nan(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
        mb = ra__max_nan(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
        float alpha = 1.0f;
        const int any = ra__state_rescale(&st.m[r], mb, &alpha);
        float sum = 0.0f;
        RA_UNROLL
        for (int n = 0; n < BK / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 2; ++c) {
                float &x = s[n][2 * r + c];
                x = any ? ra__prob(x, st.m[r]) : 0.0f;
                sum += x;
            }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (!any) continue; // SPEC 4: no allowed key yet, nothing changes
        st.l[r] = alpha * st.l[r] + sum;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 2; ++c) st.acc[n][2 * r + c] *= alpha;
    }
}

// acc += P V for keys [16 j, 16 j + 16) of the tile: P's A fragments pa, V as B through
// ldmatrix.trans.
template <int DV>
__device__ __forceinline__ void pv_step(bool bf16, ra_smem<uint16_t> sv, const lane_at &ln,
                                        int j, const uint32_t pa[4], float acc[DV / 8][4])
{
    RA_UNROLL
    for (int dp = 0; dp < DV / 16; ++dp) {
        uint32_t vb[4];
        const int bm = ln.lane >> 3, br = ln.lane & 7;
        ra_ldmatrix_x4(true, vb, sv + swz<DV>(j * 16 + (bm & 1) * 8 + br, dp * 16 + (bm >> 1) * 8));
        ra_mma_16816(bf16, acc[2 * dp], pa, vb, acc[2 * dp]);
        ra_mma_16816(bf16, acc[2 * dp + 1], pa, vb + 2, acc[2 * dp + 1]);
    }
}

// acc += P V: P's accumulators are the A fragments, rounded to 16 bits (SPEC 9's default
// level, as FlashAttention rounds them). At the high level (split) P goes in two 16-bit parts,
// the rounded P and then what its rounding lost (split_p), so that O carries no rounding of P
// beyond a plain float32 implementation's (SPEC 9: the backward's D_i = dO . O inherits O's
// error). One part's fragments live at a time (V's fragments are loaded twice): the D_v = 128
// tiles do not spill.
template <int BK, int DV>
__device__ __forceinline__ void accumulate_pv(bool bf16, bool split, ra_smem<uint16_t> sv,
                                              const lane_at &ln, float s[BK / 8][4],
                                              float acc[DV / 8][4])
{
    RA_UNROLL
    for (int j = 0; j < BK / 16; ++j) {
        uint32_t pa[4];
        if (split) {
            RA_UNROLL
            for (int f = 0; f < 4; ++f) // fragment f: n-tile 2j + f / 2, rows 2 (f % 2) + {0, 1}
                pa[f] = split_p(bf16, s[2 * j + f / 2][2 * (f % 2)], s[2 * j + f / 2][2 * (f % 2) + 1]);
            pv_step<DV>(bf16, sv, ln, j, pa, acc);
        }
        RA_UNROLL
        for (int f = 0; f < 4; ++f)
            pa[f] = ra_pack_16x2(bf16, s[2 * j + f / 2][2 * (f % 2)], s[2 * j + f / 2][2 * (f % 2) + 1]);
        pv_step<DV>(bf16, sv, ln, j, pa, acc);
    }
}

// The rows' state at the end of the step: kept for the next one (device memory), or finalised
// (SPEC 4, softmax_state.h: an empty row gives O = 0 and LSE = -inf) into O and LSE.
template <int DV>
__device__ __forceinline__ void store_state(const ra_attn_args &a, const block_at<DV> &b,
                                            const lane_at &ln, const rows_state<DV> &st)
{
    const bool bf16 = a.bf16 != 0;
    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int row = st.rows[r];
        if (row >= b.rows) continue;
        const int64_t at = (int64_t)b.h * a.tq + b.first_row + row;
        if (!a.last) {
            if (ln.t == 0) a.m[at + b.zstate] = st.m[r], a.l[at + b.zstate] = st.l[r];
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    const int col = n * 8 + 2 * ln.t + c;
                    if (col < b.dv) a.acc[at * a.dv + b.v0 + col] = st.acc[n][2 * r + c];
                }
            continue;
        }
        const float inv = ra__state_out_scale(st.l[r]);
        uint16_t *o = static_cast<uint16_t *>(a.o) + b.v0 + (b.first_row + row) * a.o_row +
                      (int64_t)b.h * a.o_head;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n) {
            if (n * 8 >= b.dv) break; // dv is a multiple of 8
            const uint32_t pair = ra_pack_16x2(bf16, st.acc[n][2 * r] * inv, st.acc[n][2 * r + 1] * inv);
            ra_count_global_store(o + n * 8 + 2 * ln.t, 2);
            o[n * 8 + 2 * ln.t] = (uint16_t)(pair & 0xffff);
            ra_count_global_store(o + n * 8 + 2 * ln.t + 1, 2);
            o[n * 8 + 2 * ln.t + 1] = (uint16_t)(pair >> 16);
        }
        if (ln.t == 0 && b.owner) {
            ra_count_global_store(a.lse + at, 4);
            a.lse[at] = ra__state_lse(st.m[r], st.l[r]);
        }
    }
}

} // namespace ra_fwd

// Grid: (the tile list's query tiles, heads, blocks over D_v); 128 threads. Each key tile:
// load K and V, S = Q K^T, mask and update, acc += P V; then the state kept or finalised.
template <int D, int DV>
__global__ void __launch_bounds__(128, 1) ra_fwd_tile_kernel(ra_attn_args a)
{
    using namespace ra_fwd;
    RA_DYNAMIC_SMEM(uint16_t, sm);
    static_assert(D % 16 == 0 && D <= 256 && DV % 16 == 0 && DV <= 128, "instantiated head dims");
    constexpr int BK = ra__cuda_keys_per_tile(D, DV);
    const ra_smem<uint16_t> sq = sm, sk = sm + BQ * D, sv = sk + BK * D;
    const block_at<DV> b = this_block<DV>(a);
    const lane_at ln = this_lane();
    const uint16_t *gq = static_cast<const uint16_t *>(a.q), *gk = static_cast<const uint16_t *>(a.k),
                   *gv = static_cast<const uint16_t *>(a.v);
    const bool bf16 = a.bf16 != 0;
    const int qshift = q_shift(a);

    load_tile<D>(sq, gq + b.first_row * a.q_row + b.h * a.q_head, a.q_row, 0, b.rows, BQ, a.d);
    ra_cp_async_commit();
    if (qshift) { // uniform: the whole call's inputs decide it
        ra_cp_async_wait<0>();
        __syncthreads();
        shift_tile(sq, BQ * D, qshift);
    }
    rows_state<DV> st;
    load_state<DV>(a, b, ln, qshift, st);
    const float tmin = a.thr_b ? block_min<WARPS>(fminf(st.rc[0].tb, st.rc[1].tb)) : INFINITY;

    // Q's A fragments: in registers, loaded at the first key tile, while D + D_v <= 128; above,
    // they are read from shared memory at each k-step (Q stays there), so that the larger head
    // dims fit the register file without spills
    constexpr bool q_in_registers = D + DV <= 128;
    uint32_t qf[q_in_registers ? D / 16 : 1][4];
    bool q_loaded = false;
    for_each_key_tile(a, (int)blockIdx.x, BK, st.rc[0].bias, tmin, [&](const key_tile &kt) {
        const ra_segment &kseg = kt.seg;
        const int lk = (int)kseg.span.count;
        load_tile<D>(sk, gk + kseg.row * a.k_row + b.hk * a.k_head, a.k_row, kt.k0, lk, BK, a.d);
        load_tile<DV>(sv, gv + kseg.row * a.v_row + b.hk * a.v_head + b.v0, a.v_row, kt.k0, lk, BK,
                      b.dv);
        ra_cp_async_commit();
        ra_cp_async_wait<0>();
        __syncthreads();
        if (q_in_registers && !q_loaded) {
            q_loaded = true;
            RA_UNROLL
            for (int kk = 0; kk < (q_in_registers ? D / 16 : 0); ++kk) q_fragment<D>(sq, ln, kk, qf[kk]);
        }
        float s[BK / 8][4]; // the warp's 16 rows x BK keys
        scores<D, BK, q_in_registers>(bf16, sq, sk, ln, qf, s);
        softmax_update<BK, DV>(a, kt, ln, st, s);
        accumulate_pv<BK, DV>(bf16, a.split_p != 0, sv, ln, s, st.acc);
        __syncthreads(); // the next tiles overwrite sk and sv
    });
    ra_cp_async_wait<0>(); // a tile that met no key tile still has Q's copies in flight
    store_state<DV>(a, b, ln, st);
}

// Shared memory of ra_fwd_tile_kernel<D, DV>: Q, K and V tiles.
constexpr size_t ra_fwd_tile_smem(int d, int dv)
{
    return ((size_t)(ra_fwd::BQ + ra__cuda_keys_per_tile(d, dv)) * d +
            (size_t)ra__cuda_keys_per_tile(d, dv) * dv) * 2;
}
