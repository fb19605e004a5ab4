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
};

// The backward's tiles: 32 x 32 while D + D_v <= 256, else 16 x 16, so that a block's float32
// tiles and accumulators stay near 96 KiB of shared memory at any head dim.
inline int ra__cuda_bwd_tile(int d, int dv) { return d + dv <= 256 ? 32 : 16; }

// Shared memory of either pass: Q, dO, K, V tiles, two accumulators of a tile's rows (the key
// pass's dK, dV or the query pass's dQ), P, dS and dZ of a tile pair, and a dBias row.
inline size_t ra__cuda_bwd_smem(int d, int dv)
{
    const size_t t = (size_t)ra__cuda_bwd_tile(d, dv);
    return (3 * t * (d + dv) + 3 * t * t + t) * sizeof(float);
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
    return dt == 1 ? ra__bf16_to_f32(h) : ra__f16_to_f32(h);
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
// into a tile of n rows of `dim` columns; zeros at and past row `rows`.
__device__ __forceinline__ void load_rows(ra_smem<float> tile, const void *base, int64_t at,
                                          int64_t rs, int64_t r0, int64_t rows, int n, int dim,
                                          int dt)
{
    for (int i = (int)threadIdx.x; i < n * dim; i += (int)blockDim.x) {
        const int r = i / dim, c = i % dim;
        tile[i] = r0 + r < rows ? load(base, at + (r0 + r) * rs + c, dt) : 0.0f;
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

// The dot product of two tile rows as the float32 forward kernel takes it (forward_f32.cuh):
// a chain of FFMA over the even columns and one over the odd, then their sum, so that the
// logits of both directions are the same bits (SPEC 9: P = exp(s - LSE) of huge logits that
// cancel is exact only then). One thread: bitwise repeatable. With a SPEC 9 shift, x's
// elements times 2^-shift first (exact).
// (The loads of x and y are statements of their own: the emulation's counters tell requests
// apart by line.)
__device__ __forceinline__ float dot(ra_smem<float> x, ra_smem<float> y, int n, int shift)
{
    float even = 0.0f, odd = 0.0f;
    for (int c = 0; c < n; c += 2) {
        const float x0 = x[c];
        const float y0 = y[c];
        even = ra_fma(shift ? ldexpf(x0, -shift) : x0, y0, even);
        if (c + 1 >= n) break;
        const float x1 = x[c + 1];
        const float y1 = y[c + 1];
        odd = ra_fma(shift ? ldexpf(x1, -shift) : x1, y1, odd);
    }
    return even + odd;
}

} // namespace ra_bwd

// backward.cu: the three launches on stream s; 0 or a cudaError_t.
int ra__cuda_backward_prologue(const ra_bwd_args &a, const void *o, int64_t o_row, int64_t o_head,
                               const float *row_m, const float *row_l, cudaStream_t s);
int ra__cuda_backward_keys(const ra_bwd_args &a, int key_tiles, int kv_blocks, cudaStream_t s);
int ra__cuda_backward_queries(const ra_bwd_args &a, int query_tiles, cudaStream_t s);
// SPEC 9: (m, l) of the query tiles holding a row whose LSE is lossy, one ring step (a.f.first:
// the state starts here), with the backward's own logits, so that P = exp(s - m) / l is exact.
int ra__cuda_backward_stats(const ra_bwd_args &a, int query_tiles, cudaStream_t s);
