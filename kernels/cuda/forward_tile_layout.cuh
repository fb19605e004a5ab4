// The tensor-core forward kernel's tiles (forward_tile.cuh): its shape per head dim, the
// swizzled shared-memory layout and its cp.async loads, SPEC 9's shift of the Q tile, P's split
// at the high precision level, and where a lane and a block are.
#pragma once

#include "kernels/cuda/forward_common.cuh"

namespace ra_fwd {

// The kernel's shape for head-dim tiles D, DV (ra__cuda_query_tile, ra__cuda_keys_per_tile).
template <int D, int DV, bool FULL_FEATURES> struct tc_shape {
    static constexpr int WARPS = 4;
    static constexpr int BQ = ra__cuda_query_tile(D, FULL_FEATURES), BK = ra__cuda_keys_per_tile(D);
    static constexpr int MT = BQ / (16 * WARPS); // m-tiles of 16 rows per warp
    // k-steps of Q's A fragments held in registers: all of them while they fit beside the
    // accumulators and S (D + D_v <= 128), else the last one (an eighth of Q's shared reads at
    // D = 128), the others read from shared memory at each k-step
    static constexpr int QK = D + DV <= 128 ? D / 16 : 1;
};

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
// rounding lost (the second part of P at SPEC 9's high level).
template <bool BF16> __device__ __forceinline__ uint32_t split_p(float &x0, float &x1)
{
    const uint32_t hi = ra_pack_16x2(BF16, x0, x1);
    float r0, r1;
    ra_unpack_16x2(BF16, hi, r0, r1);
    x0 -= r0, x1 -= r1;
    return hi;
}

// A lane's place in its block: warp, lane, and its quad coordinates in the mma fragments
// (g: row within an 8-row group, t: column pair).
struct lane_at {
    int lane, warp, g, t;
};

__device__ __forceinline__ lane_at this_lane()
{
    const int lane = (int)threadIdx.x & 31;
    return lane_at{lane, (int)threadIdx.x >> 5, lane >> 2, lane & 3};
}

// The query tile of a block and the D_v columns it owns: its span, first local row and rows,
// its head and kv head, its block over D_v (blockIdx.z, forward_common.cuh).
struct block_at {
    ra_span tile;
    int64_t first_row, delta, zstate; // zstate: this D_v block's copy of (m, l)
    int rows, h, hk, v0, dv;
    bool owner;                       // writes LSE
};

template <int BQ, int DV> __device__ __forceinline__ block_at this_block(const ra_attn_args &a)
{
    block_at b;
    query_tile(a, (int)blockIdx.x, BQ, &b.tile, &b.first_row);
    b.rows = (int)b.tile.count;
    b.delta = a.delta[b.tile.seq];
    b.h = (int)blockIdx.y, b.hk = b.h / (a.heads / a.kv_heads);
    b.v0 = (int)blockIdx.z * DV, b.dv = a.dv - b.v0 < DV ? a.dv - b.v0 : DV;
    b.owner = blockIdx.z == 0;
    b.zstate = (int64_t)blockIdx.z * a.state_z;
    return b;
}

// The tile row of m-tile mt, half hh (rows g and g + 8) of the lane's warp.
template <int MT> __device__ __forceinline__ int tile_row(const lane_at &ln, int mt, int hh)
{
    return (ln.warp * MT + mt) * 16 + ln.g + 8 * hh;
}

} // namespace ra_fwd
