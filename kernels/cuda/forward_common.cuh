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
    // D_v above one tile (blockIdx.z blocks) over several steps: each block's (m, l) copy is
    // state_z elements after the previous one's, so no block reads a state another rewrites
    int64_t state_z;
};

// The tile kernel's keys per tile for head-dim tiles (d, dv): 64, and 32 at D = 256 or D_v = 128,
// where S of 64 keys beside the accumulators and both parts of P (split_p) would spill. The
// backend reports it as the plan's block_k.
__host__ __device__ constexpr int ra__cuda_keys_per_tile(int d, int dv)
{
    return d >= 256 || dv >= 128 ? 32 : 64;
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

// One tile of the other side of an item: [k0, k0 + count) of segment seg's indices.
struct key_tile {
    const ra_segment &seg;
    int k0, count; // count: rows inside the segment (<= the block)
    bool full;     // every (row, key) pair of the tile is allowed and no selection applies
};

// body(tile) for every tile of the other side's segments (segs, tiles of `block` rows) that a
// list item `it` meets, in the list's order (masks/tiles.h: the plan classified them, EMPTY
// ones are not listed). With a top-k selection (a.thr_b), a tile kept(seg, k0, n) denies is
// skipped (a block-uniform answer: every thread calls it); FULL only for a whole tile without
// a selection. Every thread of the block calls it.
template <class Kept, class Body>
__device__ __forceinline__ void for_each_run_tile(const ra_attn_args &a, const ra_tile_item &it,
                                                  const ra_tile_run *runs,
                                                  const ra_segment *segs, int block, Kept kept,
                                                  Body body)
{
    for (int r = it.run; r < it.run + it.runs; ++r) {
        const ra_tile_run run = runs[r];
        const ra_segment &seg = segs[run.seg];
        for (int t = 0; t < run.tiles; ++t) {
            const int k0 = run.first + t * block;
            const int64_t left = seg.span.count - k0;
            const int n = left < block ? (int)left : block;
            if (a.thr_b && !kept(seg, k0, n)) continue;
            const bool full = !a.thr_b && n == block && run.kind == RA_BLOCK_FULL;
            body(key_tile{seg, k0, n, full});
        }
    }
}

// The forward's walk: the key tiles that query tile `item` meets, a tile no row's top-k
// selection keeps skipped (tmin: block_min of the rows' thresholds; one thread per key, so the
// block has at least bk threads; brow: the head's key-bias row).
template <class Body>
__device__ __forceinline__ void for_each_key_tile(const ra_attn_args &a, int item, int bk,
                                                  const float *brow, float tmin, Body body)
{
    auto kept = [&](const ra_segment &kseg, int k0, int n) {
        const int j = (int)threadIdx.x;
        return __syncthreads_or(j < n && ra__topk_block_kept(brow[kseg.row + k0 + j], tmin)) != 0;
    };
    for_each_run_tile(a, a.items[item], a.runs, a.ksegs, bk, kept, body);
}

} // namespace ra_fwd
