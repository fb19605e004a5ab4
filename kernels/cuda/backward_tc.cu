// The tensor-core backward's launches (backward_tc.cuh): dQ's slices zeroed, the key-major
// kernel for the dtype, head-dim tiles, feature set, Q/dO buffering and blocks per SM, then the
// slices' sum.
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/backward_tc.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace {

// The kernel's tile of a head dim: 64, 128 or 256 (zero columns below it); where either of the
// pair takes 256, the other at least 128 (fewer instantiations).
int tc_tile(int d, int other) { return d > 128 ? 256 : d > 64 || other > 128 ? 128 : 64; }

// The kernel a device runs (backward_tc.cuh): two blocks of 8 warps an SM where they fit (the
// plain kernel at head dims up to 128, Q and dO single-buffered: every such shape on an
// H100/H200, all but D = D_v = 128 on an A100), else one block, Q and dO double-buffered where
// the block holds them and single-buffered where only that fits (an A100 at 256); 0 blocks
// where neither fits (the plan then runs the SIMT backward). The runtime reserves 1 KiB a block.
struct variant {
    int qbuf, ctas;
};

// RINGATTN_CUDA_BWD_BLOCKS=1: one block an SM even where two fit, so that a GPU can time the two
// kernels against each other (bench/gpu/speed.py); read at each launch.
bool two_blocks_allowed()
{
    const char *env = std::getenv("RINGATTN_CUDA_BWD_BLOCKS");
    return !env || std::strcmp(env, "1") != 0;
}

template <int D, int DV, bool FULL> constexpr bool has_two_ctas() { return !FULL && D <= 128 && DV <= 128; }

template <int D, int DV, bool FULL> variant choose(bool split, size_t optin, size_t per_sm)
{
    using Single = ra_bwd_tc::layout<D, DV, FULL, 1>;
    if constexpr (has_two_ctas<D, DV, FULL>())
        if (2 * (Single::bytes(split) + 1024) <= per_sm) return {1, 2};
    if (ra_bwd_tc::layout<D, DV, FULL, 2>::bytes(split) <= optin) return {2, 1};
    if constexpr (D > 128 || DV > 128)
        if (Single::bytes(split) <= optin) return {1, 1};
    return {0, 0};
}

template <bool BF16, int D, int DV, bool FULL> struct shape {
    template <int QBUF, int CTAS> static int run(const ra_bwd_args &a, dim3 grid, cudaStream_t s)
    {
        int st;
        RA_LAUNCH(st, (ra_bwd_tc_kernel<BF16, D, DV, FULL, QBUF, CTAS>), grid, dim3(ra_bwd_tc::THREADS),
                  (ra_bwd_tc::layout<D, DV, FULL, QBUF>::bytes(a.f.split_p != 0)), s, a);
        return st;
    }
    static int launch(const ra_bwd_args &a, dim3 grid, cudaStream_t s, size_t optin, size_t per_sm)
    {
        const variant v = choose<D, DV, FULL>(a.f.split_p != 0, optin, per_sm);
        if constexpr (has_two_ctas<D, DV, FULL>())
            if (v.ctas == 2) return run<1, 2>(a, grid, s);
        if constexpr (D > 128 || DV > 128)
            if (v.qbuf == 1) return run<1, 1>(a, grid, s);
        return run<2, 1>(a, grid, s);
    }
    static size_t smem(bool split, size_t optin, size_t per_sm)
    {
        const variant v = choose<D, DV, FULL>(split, optin, per_sm);
        return v.qbuf == 1 ? ra_bwd_tc::layout<D, DV, FULL, 1>::bytes(split)
                           : ra_bwd_tc::layout<D, DV, FULL, 2>::bytes(split);
    }
};

// f(shape<...>()) for the dtype, features and tiles of (d, dv).
template <bool BF16, bool FULL, class F> auto by_tiles(int d, int dv, F &&f)
{
    switch (tc_tile(d, dv) * 1000 + tc_tile(dv, d)) {
    case 64064: return f(shape<BF16, 64, 64, FULL>());
    case 64128: return f(shape<BF16, 64, 128, FULL>());
    case 128064: return f(shape<BF16, 128, 64, FULL>());
    case 128128: return f(shape<BF16, 128, 128, FULL>());
    case 128256: return f(shape<BF16, 128, 256, FULL>());
    case 256128: return f(shape<BF16, 256, 128, FULL>());
    default: return f(shape<BF16, 256, 256, FULL>());
    }
}

template <class F> auto by_shape(bool bf16, bool full, int d, int dv, F &&f)
{
    if (bf16) return full ? by_tiles<true, true>(d, dv, f) : by_tiles<true, false>(d, dv, f);
    return full ? by_tiles<false, true>(d, dv, f) : by_tiles<false, false>(d, dv, f);
}

} // namespace

int ra__cuda_backward_tc(const ra_bwd_args &a, int kv_blocks, cudaStream_t s)
{
    const size_t copies = (size_t)a.slices * a.f.heads * a.f.tq * a.f.d * sizeof(float);
    int st = (int)cudaMemsetAsync(a.dq_slices, 0, copies, s);
    if (st == 0 && a.key_items > 0) {
        const dim3 grid((unsigned)a.slices, (unsigned)kv_blocks);
        const size_t optin = (size_t)ra__cuda_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, -1),
                     per_sm = two_blocks_allowed() ? (size_t)ra__cuda_attribute(
                                                         cudaDevAttrMaxSharedMemoryPerMultiprocessor, -1)
                                                   : 0;
        st = by_shape(a.f.bf16, a.f.full_features != 0, a.f.d, a.f.dv,
                      [&](auto sh) { return decltype(sh)::launch(a, grid, s, optin, per_sm); });
    }
    const size_t n = (size_t)a.f.heads * a.f.tq * a.f.d;
    if (st == 0)
        RA_LAUNCH(st, ra_bwd_dq_sum_kernel, dim3(ra__cuda_blocks_for(n)), dim3(RA_CUDA_THREADS), 0, s, a);
    return st;
}

size_t ra__cuda_bwd_tc_smem(int d, int dv, bool full, bool split, size_t optin)
{
    return by_shape(true, full, d, dv, [&](auto sh) { return decltype(sh)::smem(split, optin, 0); });
}

// FlashAttention 2's deterministic split: enough slices for two blocks per SM over the kv-head
// blocks (two waves of the kernel's one block an SM), no more than the key tiles, and copies of
// at most max_bytes (one slice at least).
int ra__cuda_bwd_tc_slices(int sms, int kv_heads, int key_tiles, size_t slice_bytes, size_t max_bytes)
{
    int n = (2 * sms + kv_heads - 1) / kv_heads;
    if (n > key_tiles) n = key_tiles;
    const size_t fit = slice_bytes ? max_bytes / slice_bytes : (size_t)n;
    if ((size_t)n > fit) n = (int)fit;
    return n < 1 ? 1 : n;
}
