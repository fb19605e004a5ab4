// The forward kernels' head-dim tiles and the dispatch over them (forward_tile.cu, forward_f32.cu
// instantiate one kernel family each, so that nvcc builds them in parallel): D in {32, 64, 96,
// 128, 256} and D_v in {32, 64, 96, 128} (above 128 in blocks of 128). A head dim between two
// tiles runs in the larger one with zero columns (80 in 96; at D = 256, D_v = 32 in 64).
// Grid: (query tiles, heads, blocks over D_v).
#pragma once

#include <type_traits>

#include "kernels/cuda/forward_common.cuh"

// The smallest tile that holds d, or 0 when none does.
inline int ra__cuda_dim_tile(int d)
{
    const int tiles[] = {32, 64, 96, 128, 256};
    for (int t : tiles)
        if (d <= t) return t;
    return 0;
}

// D_v above 128 runs in blocks of 128 columns (gridDim.z, forward_common.cuh).
inline int ra__cuda_dim_v_tile(int dv)
{
    const int t = ra__cuda_dim_tile(dv);
    return t <= 128 ? t : t ? 128 : 0;
}

// The blocks over D_v of each (query tile, head).
inline int ra__cuda_dim_v_blocks(int dv) { return dv > 128 ? (dv + 127) / 128 : 1; }

// The tensor-core kernel's D_v tile: 64 or 128 (forward_tile.cu; fewer instantiations than the
// float32 kernel's four, at the price of zero columns for D_v of 32 or 96).
inline int ra__cuda_tc_dv_tile(int dv) { return dv <= 64 ? 64 : 128; }

// Launcher<D, DV>::run(a, grid, stream) for the tiles of a.d and a.dv; 0 or a cudaError_t.
template <template <int, int> class Launcher>
int ra__cuda_dispatch_dims(const ra_attn_args &a, int tiles, cudaStream_t s)
{
    const dim3 grid((unsigned)tiles, (unsigned)a.heads, (unsigned)ra__cuda_dim_v_blocks(a.dv));
    auto dv = [&](auto d) {
        constexpr int D = decltype(d)::value;
        switch (ra__cuda_dim_v_tile(a.dv)) {
        case 32: // at D = 256 the FFMA kernel spills with D_v = 32: that runs in the 64 tile
            if (D < 256) return Launcher<D, D < 256 ? 32 : 64>::run(a, grid, s);
            [[fallthrough]];
        case 64: return Launcher<D, 64>::run(a, grid, s);
        case 96: return Launcher<D, 96>::run(a, grid, s);
        default: return Launcher<D, 128>::run(a, grid, s);
        }
    };
    switch (ra__cuda_dim_tile(a.d)) {
    case 32: return dv(std::integral_constant<int, 32>());
    case 64: return dv(std::integral_constant<int, 64>());
    case 96: return dv(std::integral_constant<int, 96>());
    case 128: return dv(std::integral_constant<int, 128>());
    default: return dv(std::integral_constant<int, 256>());
    }
}

// forward_tile.cu (bf16, f16 on tensor cores) and forward_f32.cu (float32 on FFMA).
int ra__cuda_forward_tile(const ra_attn_args &a, int tiles, cudaStream_t s);
int ra__cuda_forward_f32(const ra_attn_args &a, int tiles, cudaStream_t s);
