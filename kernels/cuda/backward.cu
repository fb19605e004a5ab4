// The backward kernels' launches (backward.cuh): runtime head dims and dtype, an instantiation
// of each kernel per tile.
#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/cuda_backend.h"

int ra__cuda_backward_prologue(const ra_bwd_args &a, const void *o, int64_t o_row, int64_t o_head,
                               const ra_bwd_prologue_io &io, cudaStream_t s)
{
    int st = 0;
    if (a.f.tq > 0)
        RA_LAUNCH(st, ra_bwd_prologue_kernel,
                  dim3(ra__cuda_blocks_for((size_t)a.f.tq), (unsigned)a.f.heads),
                  dim3(RA_CUDA_THREADS), 0, s, a, o, o_row, o_head, io.row_m, io.row_l, io.sinks,
                  io.dlse);
    if (st == 0 && io.dsinks) // written also without local rows: 0
        RA_LAUNCH(st, ra_bwd_sink_grad_kernel, dim3((unsigned)a.f.heads), dim3(256), 0, s, a,
                  io.sinks, io.dsinks);
    return st;
}

// The backward's tile, 32 or 16 (ra__cuda_bwd_tile), as the kernels' template argument.
#define RA_BWD_LAUNCH(st, kernel, grid, a, s)                                                   \
    do {                                                                                      \
        const size_t smem_ = ra__cuda_bwd_smem((a).f.d, (a).f.dv);                            \
        if ((a).bq == 32) RA_LAUNCH(st, kernel<32>, grid, dim3(ra_bwd::THREADS), smem_, s, a);   \
        else RA_LAUNCH(st, kernel<16>, grid, dim3(ra_bwd::THREADS), smem_, s, a);               \
    } while (0)

int ra__cuda_backward_keys(const ra_bwd_args &a, int key_tiles, int kv_blocks, cudaStream_t s)
{
    int st;
    RA_BWD_LAUNCH(st, ra_bwd_keys_kernel, dim3((unsigned)key_tiles, (unsigned)kv_blocks), a, s);
    return st;
}

int ra__cuda_backward_queries(const ra_bwd_args &a, int query_tiles, cudaStream_t s)
{
    int st;
    RA_BWD_LAUNCH(st, ra_bwd_queries_kernel, dim3((unsigned)query_tiles, (unsigned)a.f.heads), a, s);
    return st;
}

int ra__cuda_backward_stats(const ra_bwd_args &a, int query_tiles, cudaStream_t s)
{
    int st;
    RA_BWD_LAUNCH(st, ra_bwd_stats_kernel, dim3((unsigned)query_tiles, (unsigned)a.f.heads), a, s);
    return st;
}
