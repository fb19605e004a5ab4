// The float32 FFMA forward kernel (forward_f32.cuh) for every head-dim tile pair.
#include "kernels/cuda/forward_f32.cuh"
#include "kernels/cuda/forward_launch.cuh"

namespace {
template <int D, int DV> struct f32_launch {
    static int run(const ra_attn_args &a, dim3 grid, cudaStream_t s)
    {
        int st;
        RA_LAUNCH(st, (ra_fwd_f32_kernel<D, DV>), grid, dim3(ra_fwd32::THREADS), ra_fwd_f32_smem(D, DV), s, a);
        return st;
    }
};
} // namespace

int ra__cuda_forward_f32(const ra_attn_args &a, int tiles, cudaStream_t s)
{
    return ra__cuda_dispatch_dims<f32_launch>(a, tiles, s);
}
