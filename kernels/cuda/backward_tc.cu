// The tensor-core backward's launches (backward_tc.cuh): dQ's slices zeroed, the key-major
// kernel for the dtype, head-dim tiles (D and D_v each in the 64 or the 128 tile) and feature
// set, then the slices' sum.
#include "kernels/cuda/backward_tc.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace {

template <bool BF16, int D, int DV, bool FULL>
int launch(const ra_bwd_args &a, dim3 grid, cudaStream_t s)
{
    const size_t smem = ra_bwd_tc::layout<D, DV, FULL>::bytes(a.f.split_p != 0);
    int st;
    RA_LAUNCH(st, (ra_bwd_tc_kernel<BF16, D, DV, FULL>), grid, dim3(128), smem, s, a);
    return st;
}

template <bool BF16, int D> int launch_dv(const ra_bwd_args &a, dim3 grid, cudaStream_t s)
{
    const bool full = a.f.full_features != 0;
    if (ra__cuda_tc_dv_tile(a.f.dv) == 64)
        return full ? launch<BF16, D, 64, true>(a, grid, s) : launch<BF16, D, 64, false>(a, grid, s);
    return full ? launch<BF16, D, 128, true>(a, grid, s) : launch<BF16, D, 128, false>(a, grid, s);
}

// D in the 64 or the 128 tile (zero columns below it): fewer instantiations to compile
template <bool BF16> int launch_d(const ra_bwd_args &a, dim3 grid, cudaStream_t s)
{
    return a.f.d <= 64 ? launch_dv<BF16, 64>(a, grid, s) : launch_dv<BF16, 128>(a, grid, s);
}

} // namespace

int ra__cuda_backward_tc(const ra_bwd_args &a, int kv_blocks, cudaStream_t s)
{
    const size_t copies = (size_t)a.slices * a.f.heads * a.f.tq * a.f.d * sizeof(float);
    int st = (int)cudaMemsetAsync(a.dq_slices, 0, copies, s);
    if (st == 0 && a.key_items > 0) {
        const dim3 grid((unsigned)a.slices, (unsigned)kv_blocks);
        st = a.f.bf16 ? launch_d<true>(a, grid, s) : launch_d<false>(a, grid, s);
    }
    const size_t n = (size_t)a.f.heads * a.f.tq * a.f.d;
    if (st == 0)
        RA_LAUNCH(st, ra_bwd_dq_sum_kernel, dim3(ra__cuda_blocks_for(n)), dim3(RA_CUDA_THREADS), 0, s, a);
    return st;
}

// FlashAttention 2's deterministic split: enough slices for two blocks per SM over the kv-head
// blocks, no more than the key tiles, and copies of at most max_bytes (one slice at least).
int ra__cuda_bwd_tc_slices(int sms, int kv_heads, int key_tiles, size_t slice_bytes, size_t max_bytes)
{
    int n = (2 * sms + kv_heads - 1) / kv_heads;
    if (n > key_tiles) n = key_tiles;
    const size_t fit = slice_bytes ? max_bytes / slice_bytes : (size_t)n;
    if ((size_t)n > fit) n = (int)fit;
    return n < 1 ? 1 : n;
}
