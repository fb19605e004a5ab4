// What the forward kernels share (forward_tile.cuh: bf16/f16 on tensor cores; forward_f32.cuh:
// float32 on FFMA): their arguments, the logit of SPEC 2, 3 and 6, the SPEC 9 scaling of Q, and
// the walk over a tile list's item (masks/tiles.h: the plan's classification, as the CPU
// backend walks it) in the segment model (masks/shard.h).
#pragma once

#include <cfloat>

#include "base/dtype.h"
#include "kernels/cuda/device.cuh"
extern "C" {
#include "kernels/params.h"
#include "masks/topk.h"
}
#include "kernels/softmax_state.h"
#include "masks/shard.h"
#include "masks/tiles.h"

// The attention kernels' arguments: the tensor-core and float32 forwards take them as they
// are, the backward inside its own (ra_bwd_args.f).
struct ra_attn_args {
    // [T_q, H, D], [T_k, H_kv, D], [T_k, H_kv, D_v] of the storage dtype (element strides)
    const void *q, *k, *v;
    int64_t q_row, q_head, k_row, k_head, v_row, v_head;
    void *o;                   // [T_q, H, D_v], written at the last step
    int64_t o_row, o_head;
    float *lse;                // [H, T_q], written at the last step
    float *m, *l, *acc;        // the running state: [H, T_q], [H, T_q], [H, T_q, D_v]
    // device memory: the query segments, the held key shard's segments, and the step's tile
    // list (masks/tiles.h) -- one block per item, heaviest first, each walking its runs: the
    // forward's query tiles against the key tiles they meet (EMPTY tiles are not listed)
    const ra_segment *qsegs, *ksegs;
    const ra_tile_item *items;
    const ra_tile_run *runs;
    const int64_t *delta;      // [num_seqs] SPEC 2: L_k - L_q
    int tq, heads, kv_heads;   // tq: the local query rows (the state's and LSE's row count)
    // the head dims: d at most the kernel's D tile (zeros beyond); dv split over gridDim.z
    // blocks of the DV tile's columns each (zeros beyond), which recompute S: D_v = 256 as two
    // blocks of 128, so that the P V accumulators fit the register file. With gridDim.z > 1
    // one step only (first and last): the blocks of a row would race on its state.
    int d, dv;
    ra_window window;          // SPEC 3, causal folded in
    // softcap 0: off; else softcap_scale = scale / softcap, the factor of the raw product inside
    // the tanh (SPEC 9: folded before it, so that nothing overflows where z scale / softcap,
    // the tanh's argument, does not)
    float scale, softcap, softcap_scale;
    const float *alibi;        // [H] device memory, or NULL
    // SPEC 6 key bias of the held shard, [bias_heads, bias_ld] (its local key rows), or NULL;
    // query head h reads bias head h / (H / bias_heads). With thr_b, the top-k thresholds of
    // the local rows, [bias_heads, tq] (masks/topk.h, RA_TOPK_KEEPS).
    const float *bias;
    int64_t bias_ld;
    int bias_heads;
    const float *thr_b;
    const int64_t *thr_p;
    // SPEC 9: max |Q| and max |K| of the call ([2], device), or NULL (float16: bounded)
    const float *absmax;
    int first, last, bf16;     // bf16: 16-bit storage is bfloat16, else float16 (tile kernel)
    int split_p;               // SPEC 9's high level: P V with P in two 16-bit parts (tile kernel)
    int full_features;         // the plan has softcap, ALiBi or a key bias: the tile kernel's
                               // FULL_FEATURES instantiation (forward_tile.cu) runs the step
    // D_v above one tile (blockIdx.z blocks) over several steps: each block's (m, l) copy is
    // state_z elements after the previous one's, so no block reads a state another rewrites
    int64_t state_z;
    const float *sinks;        // [H] device memory, or NULL: SPEC 11, joined at the last step
};

// The tensor-core kernel's tiles per head-dim tile d, FlashAttention 2's table for sm_80 and
// sm_90 (flash_fwd_launch_template.h): 128 query rows (4 warps of 32) by 64 keys up to D = 128,
// 64 by 32 at D = 256 (FA2 runs 64 x 64 there on an H100 without double buffering; with K and V
// double-buffered 32 keys keep two CTAs per SM). The kernel with softcap, ALiBi or a key bias
// (full_features: a logit of many terms per element) takes 64 query rows (4 warps of 16): its
// per-element work does not fit the registers beside 128 rows' accumulators and S. The backend
// reports them as the plan's tiles.
__host__ __device__ constexpr int ra__cuda_query_tile(int d, bool full_features)
{
    return d >= 256 || full_features ? 64 : 128;
}
__host__ __device__ constexpr int ra__cuda_keys_per_tile(int d) { return d >= 256 ? 32 : 64; }

// The float32 kernel's tiles (forward_f32.cuh): 64 query rows, two threads per row, by 16 keys.
namespace ra_fwd32 {
constexpr int BQ = 64, BK = 16, THREADS = 2 * BQ;
}

namespace ra_fwd {


// One query row's part of SPEC 2, 3 and 6.
struct row_ctx {
    int64_t pos, delta;   // its position and its sequence's L_k - L_q
    float slope;          // ALiBi
    const float *bias;    // its head's key-bias row, or NULL
    float tb;             // its top-k threshold (with a.thr_b)
    int64_t tp;
    int qshift;           // SPEC 9: Q was scaled by 2^-qshift before the product
    bool live;            // inside its tile
};

__device__ __forceinline__ row_ctx make_row(const ra_attn_args &a, int h, int64_t local_row,
                                            int64_t pos, int64_t delta, bool live, int qshift)
{
    row_ctx r{pos, delta, a.alibi ? a.alibi[h] : 0.0f, nullptr, INFINITY, 0, qshift, live};
    if (a.bias) {
        const int hb = h / (a.heads / a.bias_heads);
        r.bias = a.bias + (int64_t)hb * a.bias_ld;
        if (a.thr_b && live)
            r.tb = a.thr_b[(int64_t)hb * a.tq + local_row], r.tp = a.thr_p[(int64_t)hb * a.tq + local_row];
    }
    return r;
}

// SPEC 2 and 9: raw product z (of Q shifted by 2^-qshift) times the scale, or with a softcap the
// tanh's argument z scale / softcap.
__device__ __forceinline__ float scaled(const ra_attn_args &a, int qshift, float z)
{
    z *= a.softcap > 0.0f ? a.softcap_scale : a.scale;
    return qshift ? ldexpf(z, qshift) : z;
}

// SPEC 2, 3 and 6: the logit of raw product z for the key at position pj (local key row kr),
// or -inf where the mask forbids the pair (masked tiles only: a FULL tile allows every pair).
// Softcap and ALiBi on the scaled product, the bias added last and not scaled; a -inf bias, or
// a key the row's top-k selection drops, masks the key.
template <bool Masked>
__device__ __forceinline__ float logit(const ra_attn_args &a, const row_ctx &r, float z,
                                       bool key_in, int64_t pj, int64_t kr)
{
    if (Masked && (!r.live || !key_in || !ra__allowed(a.window, r.delta, 0, r.pos, 0, pj)))
        return -INFINITY;
    z = scaled(a, r.qshift, z);
    if (a.softcap > 0.0f) z = a.softcap * tanhf(z);
    const int64_t diag = r.pos + r.delta;
    if (a.alibi) z -= r.slope * (float)(diag > pj ? diag - pj : pj - diag);
    if (r.bias) {
        const float b = r.bias[kr];
        if (Masked && a.thr_b && !RA_TOPK_KEEPS(b, pj, r.tb, r.tp)) return -INFINITY;
        z += b;
    }
    return z;
}

// SPEC 9: when D max|q| max|k| could overflow float32 in the product, Q is scaled by 2^-qshift
// first (exact: a power of two) and the logit by 2^qshift after the softmax scale. NaN or
// infinite inputs are left to propagate, as on the CPU.
__device__ __forceinline__ int q_shift(const ra_attn_args &a)
{
    if (!a.absmax) return 0;
    const double bound = (double)a.d * a.absmax[0] * a.absmax[1];
    if (!(bound > FLT_MAX / 2.0) || !(bound < INFINITY)) return 0;
    return ilogb(bound) - 125; // bound * 2^-qshift < 2^126
}

// The smallest top-k threshold of the block's rows (each thread passes its rows' minimum;
// +inf without a selection), for skipping key tiles no row keeps. All threads call it.
template <int WARPS> __device__ __forceinline__ float block_min(float v)
{
    __shared__ float part[WARPS];
    RA_UNROLL
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = part[0];
    RA_UNROLL
    for (int w = 1; w < WARPS; ++w) m = fminf(m, part[w]);
    return m;
}

// The tile of a list item `it` of segments segs (a query tile in the forward): its span
// (positions within its sequence) and its first local row.
__device__ __forceinline__ void item_tile(const ra_tile_item &it, const ra_segment *segs,
                                          int block, ra_span *tile, int64_t *first_row)
{
    const ra_segment seg = segs[it.seg];
    *tile = ra__segment_tile(&seg, it.first, block);
    *first_row = seg.row + it.first;
}

// The query tile of list item `item`.
__device__ __forceinline__ void query_tile(const ra_attn_args &a, int item, int bq,
                                           ra_span *tile, int64_t *first_row)
{
    item_tile(a.items[item], a.qsegs, bq, tile, first_row);
}

// One tile of the other side of an item: [k0, k0 + count) of the indices of segment `seg` (of
// the walk's segments). Small on purpose: a kernel keeps the next tile beside the accumulators.
struct key_tile {
    int seg, k0, count; // count: rows inside the segment (<= the block)
    bool full;          // every (row, key) pair of the tile is allowed and no selection applies
};

// The tiles of the other side's segments (segs, tiles of `block` rows) that a list item meets,
// one at a time in the list's order (masks/tiles.h: the plan classified them, EMPTY ones are
// not listed), so that a kernel can load the next tile while it computes one. With a top-k
// selection (a.thr_b), a tile kept(seg, k0, n) denies is skipped (a block-uniform answer: every
// thread calls next); FULL only for a whole tile without a selection.
struct run_cursor {
    int r, t, end;
    __device__ explicit run_cursor(const ra_tile_item &it) : r(it.run), t(0), end(it.run + it.runs)
    {
    }
    template <class Kept>
    __device__ __forceinline__ bool next(const ra_attn_args &a, const ra_tile_run *runs,
                                         const ra_segment *segs, int block, Kept kept,
                                         key_tile &out)
    {
        while (r < end) {
            const ra_tile_run run = runs[r];
            if (t == run.tiles) {
                ++r, t = 0;
                continue;
            }
            const int k0 = run.first + t++ * block;
            const int64_t left = segs[run.seg].span.count - k0;
            const int n = left < block ? (int)left : block;
            if (a.thr_b && !kept(segs[run.seg], k0, n)) continue;
            out = key_tile{run.seg, k0, n, !a.thr_b && n == block && run.kind == RA_BLOCK_FULL};
            return true;
        }
        return false;
    }
};

// body(tile) for every tile run_cursor gives. Every thread of the block calls it.
template <class Kept, class Body>
__device__ __forceinline__ void for_each_run_tile(const ra_attn_args &a, const ra_tile_item &it,
                                                  const ra_tile_run *runs,
                                                  const ra_segment *segs, int block, Kept kept,
                                                  Body body)
{
    run_cursor cur(it);
    for (key_tile kt; cur.next(a, runs, segs, block, kept, kt);) body(kt);
}

// A tile no row's top-k selection keeps is skipped: its largest bias is below the smallest
// threshold of the block's rows (tmin: block_min of the rows' thresholds; one thread per key,
// so the block has at least that many threads; brow: the head's key-bias row). A vote of the
// block: every thread calls it.
struct topk_kept {
    const float *brow;
    float tmin;
    __device__ __forceinline__ bool operator()(const ra_segment &kseg, int k0, int n) const
    {
        const int j = (int)threadIdx.x;
        return __syncthreads_or(j < n && ra__topk_block_kept(brow[kseg.row + k0 + j], tmin)) != 0;
    }
};

// The forward's walk: the key tiles that query tile `item` meets, a tile no row's top-k
// selection keeps skipped (topk_kept).
template <class Body>
__device__ __forceinline__ void for_each_key_tile(const ra_attn_args &a, int item, int bk,
                                                  const float *brow, float tmin, Body body)
{
    for_each_run_tile(a, a.items[item], a.runs, a.ksegs, bk, topk_kept{brow, tmin}, body);
}

} // namespace ra_fwd
