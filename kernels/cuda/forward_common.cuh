// What the forward kernels share (forward_tile.cuh: bf16/f16 on tensor cores; forward_f32.cuh:
// float32 on FFMA): their arguments, the logit of SPEC 2 and 3, and the walk over the query
// tile and the key tiles of the segment model (masks/shard.h, as the CPU backend sees tokens).
#pragma once

#include "kernels/cuda/device.cuh"
#include "kernels/softmax_state.h"
#include "masks/shard.h"

struct ra_fwd_tile_args {
    // [T_q, H, D], [T_k, H_kv, D], [T_k, H_kv, D_v] of the storage dtype (element strides)
    const void *q, *k, *v;
    int64_t q_row, q_head, k_row, k_head, v_row, v_head;
    void *o;                   // [T_q, H, D_v], written at the last step
    int64_t o_row, o_head;
    float *lse;                // [H, T_q], written at the last step
    float *m, *l, *acc;        // the running state: [H, T_q], [H, T_q], [H, T_q, D_v]
    // device memory: the query segments and the tiles to compute (segment, first index) pairs,
    // the held key shard's segments and, per sequence, its first segment ([num_seqs + 1])
    const ra_segment *qsegs, *ksegs;
    const int32_t *work, *kseq_first;
    const int64_t *delta;      // [num_seqs] SPEC 2: L_k - L_q
    int tq, heads, kv_heads;   // tq: the local query rows (the state's and LSE's row count)
    ra_window window;          // SPEC 3, causal folded in
    float scale, softcap, inv_softcap; // softcap 0: off
    const float *alibi;        // [H] device memory, or NULL
    // SPEC 6 key bias of the held shard, [bias_heads, bias_ld] (its local key rows), or NULL;
    // query head h reads bias head h / (H / bias_heads). (Top-k selection: not yet.)
    const float *bias;
    int64_t bias_ld;
    int bias_heads;
    int first, last, bf16;     // bf16: 16-bit storage is bfloat16, else float16 (tile kernel)
};

namespace ra_fwd {

// SPEC 2 and 3 for the query at position pi and the key at position pj (local key row kr) of
// one sequence: the logit of the raw product z, or -inf where the mask forbids the pair (or the
// row or key is past its tile's end: live = 0). bias: the head's row of the key bias, or NULL;
// added last and not scaled (SPEC 2), a -inf bias masks the key.
__device__ __forceinline__ float logit(const ra_fwd_tile_args &a, float z, int live, int64_t pi,
                                       int64_t pj, int64_t kr, int64_t delta, float slope,
                                       const float *bias)
{
    if (!live || !ra__allowed(a.window, delta, 0, pi, 0, pj)) return -INFINITY;
    const int64_t diag = pi + delta;
    z *= a.scale;
    if (a.softcap > 0.0f) z = a.softcap * tanhf(z * a.inv_softcap);
    if (a.alibi) z -= slope * (float)(diag > pj ? diag - pj : pj - diag);
    if (bias) z += bias[kr];
    return z;
}

// The key bias row query head h reads (SPEC 6), or NULL without a bias.
__device__ __forceinline__ const float *bias_row(const ra_fwd_tile_args &a, int h)
{
    return a.bias ? a.bias + (int64_t)(h / (a.heads / a.bias_heads)) * a.bias_ld : nullptr;
}

// The query tile of work item `item`: its span (positions within its sequence) and its first
// local row.
__device__ __forceinline__ void query_tile(const ra_fwd_tile_args &a, int item, int bq,
                                           ra_span *tile, int64_t *first_row)
{
    const ra_segment seg = a.qsegs[a.work[2 * item]];
    const int t0 = a.work[2 * item + 1];
    const int64_t left = seg.span.count - t0;
    *tile = ra_span{seg.span.seq, seg.span.pos + t0 * seg.span.stride, seg.span.stride,
                    left < bq ? left : bq};
    *first_row = seg.row + t0;
}

// body(kseg, k0) for every key tile [k0, k0 + bk) of every key segment of the query tile's
// sequence that lies inside the window's hull (masks/mask.h, shared with the CPU): the tiles
// outside are EMPTY for every row of the tile and skipped exactly (an update by a fully masked
// tile rescales by exp(0) = 1 and adds 0).
template <class Body>
__device__ __forceinline__ void for_each_key_tile(const ra_fwd_tile_args &a, const ra_span &qtile,
                                                  int64_t delta, int bk, Body body)
{
    for (int ks = a.kseq_first[qtile.seq]; ks < a.kseq_first[qtile.seq + 1]; ++ks) {
        const ra_segment kseg = a.ksegs[ks];
        int64_t lo, hi;
        ra__key_hull(a.window, delta, &qtile, &kseg.span, &lo, &hi);
        for (int64_t k0 = lo / bk * bk; k0 < hi; k0 += bk) body(kseg, (int)k0);
    }
}

} // namespace ra_fwd
