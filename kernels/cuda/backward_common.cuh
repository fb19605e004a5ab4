// What the backward kernels share (backward.cuh): their arguments, the storage loads and stores,
// the tile sizes, and SPEC 7 on one (query row, key) pair. The logit, the segment walk and the
// SPEC 9 shift of Q are the forward's (forward_common.cuh), so both passes see exactly the
// forward's mask.
#pragma once

#include "kernels/cuda/forward_common.cuh"

struct ra_bwd_args {
    ra_attn_args f;      // Q, K, V, the segments, the logit and the mask (f.o, f.m, ... unused)
    const void *dout;        // [T_q, H, D_v]
    int64_t do_row, do_head;
    // outputs: the storage dtype, or float32 sums added to with accumulate (ring steps)
    void *dq, *dk, *dv;
    int64_t dq_row, dq_head, dk_row, dk_head, dv_row, dv_head;
    float *dbias;            // [bias_heads, bias_ld] or NULL: not wanted
    int accumulate;
    int dtype;               // 0 float32, 1 bfloat16, 2 float16 (storage)
    // the prologue's per-row values, [H, T_q] each: D_i, and P = exp(s - shift) * pscale
    float *drow, *pshift, *pscale;
    // key pass: the held shard's key tiles against the query tiles they meet (masks/tiles.h,
    // key-major; f.items, f.runs: the query pass's query-major list of the same tiles)
    const ra_tile_item *kitems;
    const ra_tile_run *kruns;
    int bq, bk;              // the tiles (ra__cuda_bwd_tile)
    // the tensor-core backward (backward_tc.cuh): its key-major list's items (kitems, kruns:
    // tiles of RA_BWD_TC_KEYS keys against RA_BWD_TC_QUERIES queries), and the slices' float32
    // copies of dQ, [slices][H][T_q][D]
    int key_items, slices;
    float *dq_slices;
};

// The tensor-core backward's tiles (bf16, f16 with D, D_v <= 256): 64 keys a block, 64 queries
// a step.
#define RA_BWD_TC_KEYS 64
#define RA_BWD_TC_QUERIES 64

// The backward's tiles: 32 x 32 while D + D_v <= 256, else 16 x 16, so that a block's float32
// tiles and accumulators stay below 113 KiB of shared memory at any head dim (two blocks per
// SM on sm_90).
inline int ra__cuda_bwd_tile(int d, int dv) { return d + dv <= 256 ? 32 : 16; }

// The pair tiles' row stride in floats (backward_tiles.cuh), a multiple of 4 (16-byte loads).
// The key pass stores rows RI ti + r (RI = T / 8) at 16 consecutive keys, two row groups a warp:
// RI lp must be 16 banks mod 32 to put them on all 32 (T = 32: 4 x 36, T = 16: 2 x 24). The
// query pass at T = 16 stores 2-row columns of 16 keys, which 24 would put on 16 banks: 20.
RA_HD int ra__cuda_bwd_pair_ld(int t, bool key_pass) { return t == 16 && key_pass ? 24 : t + 4; }

// Shared memory of either pass (backward_tiles.cuh: carve): Q, dO, K, V tiles with rows padded
// by 4 floats, two accumulators of a tile's rows (the key pass's dK, dV or the query pass's dQ),
// two pair tiles (rows padded), dBias partials and a dBias row: at D = D_v = 128 108 KiB, two
// blocks per SM on sm_90 beside the static rows.
inline size_t ra__cuda_bwd_smem(int d, int dv)
{
    const size_t t = (size_t)ra__cuda_bwd_tile(d, dv);
    const size_t lp = (size_t)ra__cuda_bwd_pair_ld((int)t, true); // the larger
    return (2 * t * (d + 4 + dv + 4) + t * (d + dv) + 2 * t * lp + 4 + 8 * t + t) * sizeof(float);
}

namespace ra_bwd {

constexpr int THREADS = 128;

__device__ __forceinline__ float load(const void *p, int64_t i, int dt)
{
    if (dt == 0) {
        ra_count_global_load(static_cast<const float *>(p) + i, 4);
        return static_cast<const float *>(p)[i];
    }
    const uint16_t h = static_cast<const uint16_t *>(p)[i];
    ra_count_global_load(static_cast<const uint16_t *>(p) + i, 2);
    return ra_unpack_16(dt == 1, h);
}

// A gradient element: added to a float32 sum, or stored in the storage dtype.
__device__ __forceinline__ void store(void *p, int64_t i, float x, int dt, int accumulate)
{
    if (accumulate || dt == 0) {
        float *e = static_cast<float *>(p) + i;
        if (accumulate) ra_count_global_load(e, 4);
        ra_count_global_store(e, 4);
        *e = accumulate ? *e + x : x;
        return;
    }
    ra_count_global_store(static_cast<uint16_t *>(p) + i, 2);
    static_cast<uint16_t *>(p)[i] = dt == 1 ? ra__f32_to_bf16(x) : ra__f32_to_f16(x);
}

// Rows [r0, r0 + n) of a tensor (elements from `at`, row stride rs, `dim` columns) as float32
// into a tile of n rows of `dim` columns, ld floats apart; zeros at and past row `rows`.
__device__ __forceinline__ void load_rows(ra_smem<float> tile, int ld, const void *base, int64_t at,
                                          int64_t rs, int64_t r0, int64_t rows, int n, int dim,
                                          int dt)
{
    for (int i = (int)threadIdx.x; i < n * dim; i += (int)blockDim.x) {
        const int r = i / dim, c = i % dim;
        tile[r * ld + c] = r0 + r < rows ? load(base, at + (r0 + r) * rs + c, dt) : 0.0f;
    }
}

// One query row as the backward sees it: the forward's row context and the prologue's values.
struct brow {
    ra_fwd::row_ctx rc;
    float shift, pscale, d; // P = exp(s - shift) * pscale; D_i
    bool empty;             // its LSE says no key is allowed: it contributes nothing (SPEC 7)
};

// stats: for the SPEC 9 stats pass, which runs before the prologue (its values unread).
__device__ __forceinline__ brow make_brow(const ra_bwd_args &a, int h, int64_t local_row,
                                          int64_t pos, int64_t delta, bool live, int qshift,
                                          bool stats)
{
    brow b;
    b.rc = ra_fwd::make_row(a.f, h, local_row, pos, delta, live, qshift);
    const int64_t at = (int64_t)h * a.f.tq + local_row;
    const bool values = live && !stats;
    b.empty = !live || ra__lse_is_empty(a.f.lse[at]);
    b.shift = values ? a.pshift[at] : 0.0f;
    b.pscale = values ? a.pscale[at] : 0.0f;
    b.d = values ? a.drow[at] : 0.0f;
    return b;
}

// SPEC 7 on one pair: z = q . k (Q shifted by 2^-qshift, SPEC 9), dp = dO . v; P, dS = P (dP - D_i)
// and dZ = dS times the softcap's derivative 1 - tanh^2. A masked pair or an empty row gives 0.
struct pair_grad {
    float p, ds, dz;
};

// pj: the key's position, kr its local row (every pair given is inside its tiles).
template <bool Masked>
__device__ __forceinline__ pair_grad grads(const ra_bwd_args &a, const brow &r, float z, float dp,
                                           int64_t pj, int64_t kr)
{
    const float s = ra_fwd::logit<Masked>(a.f, r.rc, z, true, pj, kr);
    if (r.empty || s == -INFINITY) return pair_grad{0.0f, 0.0f, 0.0f};
    const float p = expf(s - r.shift) * r.pscale;
    const float ds = p * (dp - r.d);
    float dz = ds;
    if (a.f.softcap > 0.0f) {
        const float t = tanhf(ra_fwd::scaled(a.f, r.rc.qshift, z));
        dz = ds * (1.0f - t * t);
    }
    return pair_grad{p, ds, dz};
}

} // namespace ra_bwd

// backward.cu: the three launches on stream s; 0 or a cudaError_t.
int ra__cuda_backward_prologue(const ra_bwd_args &a, const void *o, int64_t o_row, int64_t o_head,
                               const ra_bwd_prologue_io &io, cudaStream_t s);
int ra__cuda_backward_keys(const ra_bwd_args &a, int key_tiles, int kv_blocks, cudaStream_t s);
int ra__cuda_backward_queries(const ra_bwd_args &a, int query_tiles, cudaStream_t s);
// backward_tc.cu: the tensor-core backward (dK, dV, dBias and dQ's slices, then their sum) on
// a.slices blocks of kv_blocks; its slice count for a plan (1 to the key tiles, at most max_bytes
// of copies).
int ra__cuda_backward_tc(const ra_bwd_args &a, int kv_blocks, cudaStream_t s);
int ra__cuda_bwd_tc_slices(int sms, int kv_heads, int key_tiles, size_t slice_bytes, size_t max_bytes);
// The shared memory of its launch, one block an SM, on a device whose block may take optin bytes
// (more than optin where it does not fit).
size_t ra__cuda_bwd_tc_smem(int d, int dv, bool full, bool split, size_t optin);
// SPEC 9: (m, l) of the query tiles holding a row whose LSE is lossy, one ring step (a.f.first:
// the state starts here), with the backward's own logits, so that P = exp(s - m) / l is exact.
int ra__cuda_backward_stats(const ra_bwd_args &a, int query_tiles, cudaStream_t s);
