// The tensor-core forward kernel (forward_tile.cuh) for every dtype, feature set and head-dim
// tile pair: D in {32, 64, 96, 128, 256}, the D_v tile 64 or 128 (D_v above 128 in blocks of
// 128 over gridDim.z; a D_v below its tile runs with zero columns).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/forward_tile.cuh"

namespace {

template <bool BF16, int D, int DV, bool FULL> int launch(const ra_attn_args &a, dim3 grid, cudaStream_t s)
{
    // the single-V pipeline where it makes two CTAs an SM out of one (sm_80 at D = D_v = 128);
    // 1 KiB a CTA is reserved by the runtime
    bool one_v = false;
    if constexpr (ra_fwd_tile_has_one_v(D, DV, FULL)) {
        const size_t per_sm = (size_t)ra__cuda_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, -1);
        auto two_fit = [&](int vbuf) { return 2 * (ra_fwd_tile_smem(D, DV, FULL, vbuf) + 1024) <= per_sm; };
        one_v = per_sm && !two_fit(2) && two_fit(1);
    }
    return ra_fwd_tile_launch<BF16, D, DV, FULL>(a, grid, s, one_v ? 1 : 2);
}

template <bool BF16, int D> int launch_dv(const ra_attn_args &a, dim3 grid, cudaStream_t s, bool full)
{
    if (ra__cuda_tc_dv_tile(a.dv) == 64)
        return full ? launch<BF16, D, 64, true>(a, grid, s) : launch<BF16, D, 64, false>(a, grid, s);
    return full ? launch<BF16, D, 128, true>(a, grid, s) : launch<BF16, D, 128, false>(a, grid, s);
}

template <bool BF16> int launch_d(const ra_attn_args &a, dim3 grid, cudaStream_t s, bool full)
{
    switch (ra__cuda_dim_tile(a.d)) {
    case 32: return launch_dv<BF16, 32>(a, grid, s, full);
    case 64: return launch_dv<BF16, 64>(a, grid, s, full);
    case 96: return launch_dv<BF16, 96>(a, grid, s, full);
    case 128: return launch_dv<BF16, 128>(a, grid, s, full);
    default: return launch_dv<BF16, 256>(a, grid, s, full);
    }
}

} // namespace

int ra__cuda_forward_tile(const ra_attn_args &a, int tiles, cudaStream_t s)
{
    const dim3 grid((unsigned)tiles, (unsigned)a.heads, (unsigned)ra__cuda_dim_v_blocks(a.dv));
    // the plain kernel has no softcap, ALiBi or key-bias instruction (the plan's tiles follow)
    const bool full = a.full_features != 0;
    return a.bf16 ? launch_d<true>(a, grid, s, full) : launch_d<false>(a, grid, s, full);
}
