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

} // namespace ra_fwd

// Grid: (the work list's query tiles, heads); 128 threads.
template <int D, int DV>
__global__ void __launch_bounds__(128, 1) ra_fwd_tile_kernel(ra_attn_args a)
{
    using namespace ra_fwd;
    RA_DYNAMIC_SMEM(uint16_t, sm);
    static_assert(D % 16 == 0 && D <= 256 && DV % 16 == 0 && DV <= 128, "instantiated head dims");
    constexpr int BK = ra__cuda_keys_per_tile(D, DV);
    const ra_smem<uint16_t> sq = sm, sk = sm + BQ * D, sv = sk + BK * D;
    const int h = (int)blockIdx.y, hk = h / (a.heads / a.kv_heads);
    ra_span qtile;
    int64_t qb; // the tile's first local row
    query_tile(a, (int)blockIdx.x, BQ, &qtile, &qb);
    const int lq = (int)qtile.count; // this tile's query rows
    const uint16_t *gq = static_cast<const uint16_t *>(a.q), *gk = static_cast<const uint16_t *>(a.k),
                   *gv = static_cast<const uint16_t *>(a.v);
    const int64_t delta = a.delta[qtile.seq];
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    // this block's D_v columns [v0, v0 + DV) (blockIdx.z: D_v above the tile, forward_common.cuh)
    const int v0 = (int)blockIdx.z * DV, dv = a.dv - v0 < DV ? a.dv - v0 : DV;
    const bool owner = blockIdx.z == 0; // writes LSE
    const int64_t zstate = (int64_t)blockIdx.z * a.state_z; // this D_v block's copy of (m, l)
    const bool bf16 = a.bf16 != 0;
    const int qshift = q_shift(a);

    load_tile<D>(sq, gq + qb * a.q_row + h * a.q_head, a.q_row, 0, lq, BQ, a.d);
    ra_cp_async_commit();
    if (qshift) { // uniform: the whole call's inputs decide it
        ra_cp_async_wait<0>();
        __syncthreads();
        shift_tile(sq, BQ * D, qshift);
    }

    // this lane's two rows (g, g + 8 of its warp's 16, within the tile) and their state
    const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
    row_ctx rc[2];
    float m[2], l[2], acc[DV / 8][4];
    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int64_t at = (int64_t)h * a.tq + qb + rows[r];
        rc[r] = make_row(a, h, qb + rows[r], qtile.pos + rows[r] * qtile.stride, delta,
                         rows[r] < lq, qshift);
        const bool carried = rc[r].live && !a.first;
        m[r] = carried ? a.m[at + zstate] : -INFINITY;
        l[r] = carried ? a.l[at + zstate] : 0.0f;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 2; ++c) {
                const int col = n * 8 + 2 * t + c;
                acc[n][2 * r + c] = carried && col < dv ? a.acc[at * a.dv + v0 + col] : 0.0f;
            }
    }
    const float tmin = a.thr_b ? block_min<WARPS>(fminf(rc[0].tb, rc[1].tb)) : INFINITY;

    // Q's A fragments: in registers, loaded at the first key tile, while D + D_v <= 128; above,
    // they are read from shared memory at each k-step (Q stays there), so that the larger head
    // dims fit the register file without spills
    constexpr bool q_in_registers = D + DV <= 128;
    uint32_t qf[q_in_registers ? D / 16 : 1][4];
    bool q_loaded = false;
    const int qm = lane >> 3, qr = lane & 7;
    auto q_fragment = [&](int kk, uint32_t f[4]) {
        ra_ldmatrix_x4(false, f, sq + swz<D>(warp * 16 + (qm & 1) * 8 + qr, kk * 16 + (qm >> 1) * 8));
    };
    for_each_key_tile(a, (int)blockIdx.x, BK, rc[0].bias, tmin, [&](const key_tile &kt) {
        const ra_segment &kseg = kt.seg;
        const int k0 = kt.k0, lk = (int)kseg.span.count;
        load_tile<D>(sk, gk + kseg.row * a.k_row + hk * a.k_head, a.k_row, k0, lk, BK, a.d);
        load_tile<DV>(sv, gv + kseg.row * a.v_row + hk * a.v_head + v0, a.v_row, k0, lk, BK, dv);
        ra_cp_async_commit();
        ra_cp_async_wait<0>();
        __syncthreads();
        if (q_in_registers && !q_loaded) {
            q_loaded = true;
            RA_UNROLL
            for (int kk = 0; kk < (q_in_registers ? D / 16 : 0); ++kk) q_fragment(kk, qf[kk]);
        }
        // S = Q K^T, 16 x 64 per warp: 8 n-tiles of 8 keys
        float s[BK / 8][4];
        RA_UNROLL
        for (int n = 0; n < BK / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 4; ++c) s[n][c] = 0.0f;
        RA_UNROLL
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t qa[4];
            if (!q_in_registers) q_fragment(kk, qa);
            const uint32_t *af = q_in_registers ? qf[q_in_registers ? kk : 0] : qa;
            RA_UNROLL
            for (int np = 0; np < BK / 16; ++np) {
                uint32_t b[4];
                const int bm = lane >> 3, br = lane & 7;
                ra_ldmatrix_x4(false, b, sk + swz<D>(np * 16 + (bm >> 1) * 8 + br, kk * 16 + (bm & 1) * 8));
                ra_mma_16816(bf16, s[2 * np], af, b, s[2 * np]);
                ra_mma_16816(bf16, s[2 * np + 1], af, b + 2, s[2 * np + 1]);
            }
        }
        // SPEC 3 mask and SPEC 4 guarded update, row by row
        RA_UNROLL
        for (int r = 0; r < 2; ++r) {
            float mb = -INFINITY;
            RA_UNROLL
            for (int n = 0; n < BK / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    float &x = s[n][2 * r + c];
                    const int kj = k0 + n * 8 + 2 * t + c;
                    const int64_t pj = kseg.span.pos + (int64_t)kj * kseg.span.stride;
                    x = kt.full ? logit<false>(a, rc[r], x, true, pj, kseg.row + kj)
                                : logit<true>(a, rc[r], x, kj < lk, pj, kseg.row + kj);
                    mb = ra__max_nan(x, mb); // SPEC 9: a NaN row stays NaN
                }
            mb = ra__max_nan(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
            mb = ra__max_nan(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
            float alpha = 1.0f;
            const int any = ra__state_rescale(&m[r], mb, &alpha);
            float sum = 0.0f;
            RA_UNROLL
            for (int n = 0; n < BK / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    float &x = s[n][2 * r + c];
                    x = any ? ra__prob(x, m[r]) : 0.0f;
                    sum += x;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (!any) continue; // SPEC 4: no allowed key yet, nothing changes
            l[r] = alpha * l[r] + sum;
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) acc[n][2 * r + c] *= alpha;
        }
        // acc += P V: P's accumulators are the A fragments, V through ldmatrix.trans. P in two
        // 16-bit parts, the rounded P and then what its rounding lost (split_p), so that O
        // carries no rounding of P beyond a plain float32 implementation's (SPEC 9: the
        // backward's D_i = dO . O inherits O's error). One part's fragments live at a time
        // (V's fragments are loaded twice): the D_v = 128 tiles do not spill.
        auto pv = [&](int j, const uint32_t pa[4]) {
            RA_UNROLL
            for (int dp = 0; dp < DV / 16; ++dp) {
                uint32_t vb[4];
                const int bm = lane >> 3, br = lane & 7;
                ra_ldmatrix_x4(true, vb, sv + swz<DV>(j * 16 + (bm & 1) * 8 + br, dp * 16 + (bm >> 1) * 8));
                ra_mma_16816(bf16, acc[2 * dp], pa, vb, acc[2 * dp]);
                ra_mma_16816(bf16, acc[2 * dp + 1], pa, vb + 2, acc[2 * dp + 1]);
            }
        };
        RA_UNROLL
        for (int j = 0; j < BK / 16; ++j) {
            uint32_t pa[4];
            RA_UNROLL
            for (int f = 0; f < 4; ++f) // fragment f: n-tile 2j + f / 2, rows 2 (f % 2) + {0, 1}
                pa[f] = split_p(bf16, s[2 * j + f / 2][2 * (f % 2)], s[2 * j + f / 2][2 * (f % 2) + 1]);
            pv(j, pa);
            RA_UNROLL
            for (int f = 0; f < 4; ++f)
                pa[f] = ra_pack_16x2(bf16, s[2 * j + f / 2][2 * (f % 2)], s[2 * j + f / 2][2 * (f % 2) + 1]);
            pv(j, pa);
        }
        __syncthreads(); // the next tiles overwrite sk and sv
    });
    ra_cp_async_wait<0>(); // a tile that met no key tile still has Q's copies in flight

    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        if (rows[r] >= lq) continue;
        const int64_t at = (int64_t)h * a.tq + qb + rows[r];
        if (!a.last) {
            if (t == 0) a.m[at + zstate] = m[r], a.l[at + zstate] = l[r];
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    const int col = n * 8 + 2 * t + c;
                    if (col < dv) a.acc[at * a.dv + v0 + col] = acc[n][2 * r + c];
                }
            continue;
        }
        // SPEC 4 finalise (softmax_state.h): an empty row gives O = 0 and LSE = -inf
        const float inv = ra__state_out_scale(l[r]);
        uint16_t *o = static_cast<uint16_t *>(a.o) + v0 + (int64_t)(qb + rows[r]) * a.o_row +
                      (int64_t)h * a.o_head;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n) {
            if (n * 8 >= dv) break; // dv is a multiple of 8
            const uint32_t pair = ra_pack_16x2(bf16, acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
            ra_count_global_store(o + n * 8 + 2 * t, 2);
            o[n * 8 + 2 * t] = (uint16_t)(pair & 0xffff);
            ra_count_global_store(o + n * 8 + 2 * t + 1, 2);
            o[n * 8 + 2 * t + 1] = (uint16_t)(pair >> 16);
        }
        if (t == 0 && owner) {
            ra_count_global_store(a.lse + at, 4);
            a.lse[at] = ra__state_lse(m[r], l[r]);
        }
    }
}

// Shared memory of ra_fwd_tile_kernel<D, DV>: Q, K and V tiles.
constexpr size_t ra_fwd_tile_smem(int d, int dv)
{
    return ((size_t)(ra_fwd::BQ + ra__cuda_keys_per_tile(d, dv)) * d +
            (size_t)ra__cuda_keys_per_tile(d, dv) * dv) * 2;
}
