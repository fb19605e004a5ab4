// The tensor-core forward kernel (forward_tile.cuh) for every head-dim tile pair.
#include "kernels/cuda/forward_launch.cuh"
#include "kernels/cuda/forward_tile.cuh"

namespace {
template <int D, int DV> struct tile_launch {
    static int run(const ra_attn_args &a, dim3 grid, cudaStream_t s)
    {
        int st;
        RA_LAUNCH(st, (ra_fwd_tile_kernel<D, DV>), grid, dim3(128), ra_fwd_tile_smem(D, DV), s, a);
        return st;
    }
};
} // namespace

int ra__cuda_forward_tile(const ra_attn_args &a, int tiles, cudaStream_t s)
{
    return ra__cuda_dispatch_dims<tile_launch>(a, tiles, s);
}
