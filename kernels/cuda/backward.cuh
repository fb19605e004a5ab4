// The backward kernels (SPEC 7, DESIGN: CUDA: the backend): two deterministic passes, as on the
// CPU, so that repeated runs are bitwise identical (SPEC 9) with no atomics: key pass: one block
// per (key tile, kv heads) sums dK, dV (and dBias, the column sums of dS) over every query head of
// the GQA group and every query tile that sees it; query pass: one block per (query tile, head)
// sums dQ over the key tiles it sees (both walk the runs of the backward's tile lists,
// masks/tiles.h: key-major and query-major); and a prologue of D_i = rowsum(dO * O) and P's shift
// and scale once per call (SPEC 9: LSE, or the recomputed max and 1 / sum of a row whose LSE is
// lossy). Every output element has one owner thread that sums in a fixed order.
//
// SIMT FFMA in float32 for every storage dtype, head dims at run time, the tile (T = 32 or 16)
// a template: a tile pair's logits and dP as register-tiled dot products, then each
// accumulator block owned by one thread (backward_tiles.cuh: conflict-free 16-byte loads). The
// forward's logit, mask walk (EMPTY tiles skipped, FULL tiles without the per-element mask,
// SPEC 6 tiles no row keeps skipped) and SPEC 9 shift of Q are shared (forward_common.cuh).
// Tensor-core backward kernels for the 16-bit dtypes are later work (docs/DESIGN.md).
#pragma once

#include "kernels/cuda/backward_tiles.cuh"

namespace ra_bwd {

// The rows of a query tile (span qs, first local row qr, head h) into rows[] and their Q and dO
// (not for the stats pass) into the tiles; the smallest top-k threshold of its rows (+inf
// without a selection).
__device__ __forceinline__ float load_queries(const ra_bwd_args &a, const tiles &s, brow *rows,
                                              int h, const ra_span &qs, int64_t qr, int64_t delta,
                                              int qshift, bool stats = false)
{
    const int t = a.bq, n = (int)qs.count;
    for (int i = (int)threadIdx.x; i < t; i += (int)blockDim.x)
        rows[i] = make_brow(a, h, qr + i, qs.pos + i * qs.stride, delta, i < n, qshift, stats);
    load_rows(s.q, s.lq, a.f.q, qr * a.f.q_row + (int64_t)h * a.f.q_head, a.f.q_row, 0, n, t,
              a.f.d, a.dtype);
    if (!stats)
        load_rows(s.dout, s.lv, a.dout, qr * a.do_row + (int64_t)h * a.do_head, a.do_row, 0, n, t,
                  a.f.dv, a.dtype);
    __syncthreads();
    float tmin = INFINITY;
    if (a.f.thr_b) {
        for (int i = 0; i < n; ++i) tmin = fminf(tmin, rows[i].rc.tb);
        __syncthreads(); // a block that skips the tile loads the next one over rows[]
    }
    return tmin;
}

// K and V of kv head g, keys [k0, k0 + n) of segment kseg, into the tiles (zeros past n).
__device__ __forceinline__ void load_keys(const ra_bwd_args &a, const tiles &s, int g,
                                          const ra_segment &kseg, int k0, int n)
{
    load_rows(s.k, s.lq, a.f.k, kseg.row * a.f.k_row + (int64_t)g * a.f.k_head, a.f.k_row, k0,
              k0 + n, a.bk, a.f.d, a.dtype);
    load_rows(s.v, s.lv, a.f.v, kseg.row * a.f.v_row + (int64_t)g * a.f.v_head, a.f.v_row, k0,
              k0 + n, a.bk, a.f.dv, a.dtype);
}

} // namespace ra_bwd

// Prologue (SPEC 7, 9, 11): one thread per (head, local row); grid (blocks over the rows,
// grid-stride; heads), so that no 64-bit division (a call, and spills around it) finds them.
__global__ void __launch_bounds__(256) ra_bwd_prologue_kernel(ra_bwd_args a, const void *o,
                                                              int64_t o_row, int64_t o_head,
                                                              const float *row_m, const float *row_l,
                                                              const float *sinks, const float *dlse)
{
    const int64_t h = blockIdx.y;
    const float sink = sinks ? sinks[h] : -INFINITY;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < a.f.tq;
         r += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = h * a.f.tq + r;
        float d = 0.0f;
        for (int c = 0; c < a.f.dv; ++c)
            d = ra_fma(ra_bwd::load(a.dout, r * a.do_row + h * a.do_head + c, a.dtype),
                       ra_bwd::load(o, r * o_row + h * o_head + c, a.dtype), d);
        a.drow[i] = dlse ? d - dlse[i] : d;
        const float lse = a.f.lse[i];
        float m = 0.0f, l = 0.0f;
        if (row_m) m = row_m[i], l = row_l[i];
        const bool recompute = row_m && ra__lse_lossy(lse) && ra__row_stats_sink(&m, &l, sink);
        a.pshift[i] = recompute ? m : lse;
        a.pscale[i] = recompute ? 1.0f / l : 1.0f;
    }
}

// SPEC 11: dsinks_h = -sum_i P_sink,i D_i over the local rows, one block of 256 threads per
// head: strided sums, then a tree in shared memory, always in the same order (deterministic).
__global__ void __launch_bounds__(256) ra_bwd_sink_grad_kernel(ra_bwd_args a, const float *sinks,
                                                               float *dsinks)
{
    __shared__ float part[256];
    const int h = (int)blockIdx.x, tid = (int)threadIdx.x;
    const float sink = sinks ? sinks[h] : -INFINITY;
    float sum = 0.0f;
    for (int64_t r = tid; r < a.f.tq; r += 256) {
        const int64_t i = (int64_t)h * a.f.tq + r;
        sum -= ra__sink_prob(sink, a.pshift[i], a.pscale[i]) * a.drow[i];
    }
    part[tid] = sum;
    __syncthreads();
    for (int w = 128; w > 0; w /= 2) {
        if (tid < w) part[tid] += part[tid + w];
        __syncthreads();
    }
    if (tid == 0) dsinks[h] = part[0];
}

// Key pass. Grid: (the key-major list's key tiles, heaviest first; kv-head blocks); kv heads
// [g0, g0 + gb) with gb = gridDim.y == 1 ? H_kv : 1 (a block covers every kv head sharing a
// bias head, so it owns the dBias rows of its key tile).
template <int T> __global__ void __launch_bounds__(128, 2) ra_bwd_keys_kernel(ra_bwd_args a)
{
    using namespace ra_bwd;
    RA_DYNAMIC_SMEM(float, sm);
    __shared__ brow rows[32];
    const int d = a.f.d, dv = a.f.dv;
    const tiles s = carve(sm, T, d, dv, true);
    const int gb = gridDim.y == 1 ? a.f.kv_heads : 1, g0 = (int)blockIdx.y * gb;
    const int G = a.f.heads / a.f.kv_heads, per_bias = a.f.bias ? a.f.heads / a.f.bias_heads : 1;
    const ra_tile_item item = a.kitems[blockIdx.x];
    ra_span ks;
    int64_t krow;
    ra_fwd::item_tile(item, a.f.ksegs, T, &ks, &krow);
    const ra_segment kseg = a.f.ksegs[item.seg];
    const int k0 = item.first, nk = (int)ks.count;
    const int64_t delta = a.f.delta[ks.seq];
    const int qshift = ra_fwd::q_shift(a.f);
    const int tid = (int)threadIdx.x;
    int hb_open = -1; // the bias head whose dBias row s.db holds
    auto flush_dbias = [&]() {
        __syncthreads();
        if (hb_open >= 0 && a.dbias && tid < nk)
            store(a.dbias, (int64_t)hb_open * a.f.bias_ld + krow + tid, s.db[tid], 0, a.accumulate);
        if (tid < T) s.db[tid] = 0.0f;
        __syncthreads();
    };
    auto every = [](const ra_segment &, int, int) { return true; }; // top-k: below, per tile
    for (int g = g0; g < g0 + gb; ++g) {
        load_keys(a, s, g, kseg, k0, nk);
        for (int i = tid; i < T * (d + dv); i += THREADS) s.acc0[i] = 0.0f; // acc1 follows acc0
        __syncthreads();
        for (int h = g * G; h < (g + 1) * G; ++h) {
            const int hb = h / per_bias;
            if (hb != hb_open) flush_dbias(), hb_open = hb;
            // the key tile's largest bias, for skipping query tiles no row of which keeps a key
            float kmax = -INFINITY;
            if (a.f.thr_b)
                for (int j = 0; j < nk; ++j)
                    kmax = fmaxf(kmax, a.f.bias[(int64_t)hb * a.f.bias_ld + krow + j]);
            ra_fwd::for_each_run_tile(a.f, item, a.kruns, a.f.qsegs, a.bq, every,
                                      [&](const ra_fwd::key_tile &qt) {
                const ra_segment qseg = a.f.qsegs[qt.seg];
                const ra_span qs = ra__segment_tile(&qseg, qt.k0, a.bq);
                const float tmin = load_queries(a, s, rows, h, qs, qseg.row + qt.k0, delta,
                                                qshift);
                if (a.f.thr_b && !ra__topk_block_kept(kmax, tmin)) return; // SPEC 6
                const int nq = (int)qs.count;
                pair_pass<T, pairs_for::keys>(a, s, rows, nq, kseg, k0, nk, qt.full, qshift,
                                              a.dbias != nullptr);
                key_sums<T>(a, s, nq);
                if (a.dbias && tid < T) { // dBias_j += sum_i dS_ij: the row groups in order
                    float sum = 0.0f;
                    for (int r = 0; r < 8; ++r) sum += s.part[r * T + tid];
                    s.db[tid] += sum;
                }
                __syncthreads(); // the next query tile overwrites the tiles
            });
        }
        // this kv head's dK, dV rows of the key tile (zeros where no query sees a key)
        for (int e = tid; e < nk * d; e += THREADS)
            store(a.dk, (krow + e / d) * a.dk_row + (int64_t)g * a.dk_head + e % d, s.acc0[e],
                  a.dtype, a.accumulate);
        for (int e = tid; e < nk * dv; e += THREADS)
            store(a.dv, (krow + e / dv) * a.dv_row + (int64_t)g * a.dv_head + e % dv, s.acc1[e],
                  a.dtype, a.accumulate);
        __syncthreads();
    }
    flush_dbias();
}

// Query pass. Grid: (the query-major list's query tiles of T rows, heaviest first; heads).
template <int T> __global__ void __launch_bounds__(128, 2) ra_bwd_queries_kernel(ra_bwd_args a)
{
    using namespace ra_bwd;
    RA_DYNAMIC_SMEM(float, sm);
    __shared__ brow rows[32];
    const int d = a.f.d;
    const tiles s = carve(sm, T, d, a.f.dv, false);
    const int h = (int)blockIdx.y, g = h / (a.f.heads / a.f.kv_heads);
    ra_span qs;
    int64_t qr;
    ra_fwd::query_tile(a.f, (int)blockIdx.x, T, &qs, &qr);
    const int64_t delta = a.f.delta[qs.seq];
    const int qshift = ra_fwd::q_shift(a.f);
    const int tid = (int)threadIdx.x, nq = (int)qs.count;
    const float tmin = load_queries(a, s, rows, h, qs, qr, delta, qshift);
    for (int i = tid; i < T * d; i += THREADS) s.acc0[i] = 0.0f;
    __syncthreads();
    ra_fwd::for_each_key_tile(a.f, (int)blockIdx.x, T, rows[0].rc.bias, tmin,
                              [&](const ra_fwd::key_tile &kt) {
        const ra_segment kseg = a.f.ksegs[kt.seg];
        load_keys(a, s, g, kseg, kt.k0, kt.count);
        __syncthreads();
        pair_pass<T, pairs_for::queries>(a, s, rows, nq, kseg, kt.k0, kt.count, kt.full, qshift,
                                         false);
        query_sums<T>(a, s, kt.count);
        __syncthreads(); // the next key tile overwrites the tiles
    });
    for (int e = tid; e < nq * d; e += THREADS)
        store(a.dq, (qr + e / d) * a.dq_row + (int64_t)h * a.dq_head + e % d, s.acc0[e], a.dtype,
              a.accumulate);
}

// SPEC 9 stats pass (backward_common.cuh). Grid: (the query-major list's query tiles of T
// rows; heads).
template <int T> __global__ void __launch_bounds__(128, 2) ra_bwd_stats_kernel(ra_bwd_args a)
{
    using namespace ra_bwd;
    RA_DYNAMIC_SMEM(float, sm);
    __shared__ brow rows[32];
    __shared__ float row_m[32], row_l[32];
    const tiles s = carve(sm, T, a.f.d, a.f.dv, false);
    const int h = (int)blockIdx.y, g = h / (a.f.heads / a.f.kv_heads), tid = (int)threadIdx.x;
    ra_span qs;
    int64_t qr;
    ra_fwd::query_tile(a.f, (int)blockIdx.x, T, &qs, &qr);
    const int64_t delta = a.f.delta[qs.seq], at = (int64_t)h * a.f.tq + qr;
    const int qshift = ra_fwd::q_shift(a.f);
    const int n = (int)qs.count;
    if (!__syncthreads_or(tid < n && ra__lse_lossy(a.f.lse[at + tid]))) return;
    const float tmin = load_queries(a, s, rows, h, qs, qr, delta, qshift, true);
    if (tid < n) {
        row_m[tid] = a.f.first ? -INFINITY : a.f.m[at + tid];
        row_l[tid] = a.f.first ? 0.0f : a.f.l[at + tid];
    }
    ra_fwd::for_each_key_tile(a.f, (int)blockIdx.x, T, rows[0].rc.bias, tmin,
                              [&](const ra_fwd::key_tile &kt) {
        const ra_segment kseg = a.f.ksegs[kt.seg];
        load_keys(a, s, g, kseg, kt.k0, kt.count);
        __syncthreads();
        pair_pass<T, pairs_for::stats>(a, s, rows, n, kseg, kt.k0, kt.count, kt.full, qshift,
                                       false);
        if (tid < n) // SPEC 4's scalar update (no accumulator)
            ra__state_update(&row_m[tid], &row_l[tid], nullptr, 0, ra_raw(s.p + tid * s.lp),
                             kt.count, nullptr, 0);
        __syncthreads(); // the next key tile overwrites the tiles
    });
    if (tid < n) a.f.m[at + tid] = row_m[tid], a.f.l[at + tid] = row_l[tid];
}
