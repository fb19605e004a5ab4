// The backward kernels' launches (backward.cuh): runtime head dims and dtype, so one
// instantiation of each kernel.
#include "kernels/cuda/backward.cuh"

int ra__cuda_backward_prologue(const ra_bwd_args &a, const void *o, int64_t o_row, int64_t o_head,
                               const float *row_m, const float *row_l, cudaStream_t s)
{
    const int64_t n = (int64_t)a.f.heads * a.f.tq, per = 256;
    const int64_t blocks = (n + per - 1) / per;
    int st;
    RA_LAUNCH(st, ra_bwd_prologue_kernel, dim3((unsigned)(blocks < 4096 ? (blocks ? blocks : 1) : 4096)),
              dim3((unsigned)per), 0, s, a, o, o_row, o_head, row_m, row_l);
    return st;
}

int ra__cuda_backward_keys(const ra_bwd_args &a, int key_tiles, int kv_blocks, cudaStream_t s)
{
    int st;
    RA_LAUNCH(st, ra_bwd_keys_kernel, dim3((unsigned)key_tiles, (unsigned)kv_blocks),
              dim3(ra_bwd::THREADS), ra__cuda_bwd_smem(a.f.d, a.f.dv), s, a);
    return st;
}

int ra__cuda_backward_queries(const ra_bwd_args &a, int query_tiles, cudaStream_t s)
{
    int st;
    RA_LAUNCH(st, ra_bwd_queries_kernel, dim3((unsigned)query_tiles, (unsigned)a.f.heads),
              dim3(ra_bwd::THREADS), ra__cuda_bwd_smem(a.f.d, a.f.dv), s, a);
    return st;
}

int ra__cuda_backward_stats(const ra_bwd_args &a, int query_tiles, cudaStream_t s)
{
    int st;
    RA_LAUNCH(st, ra_bwd_stats_kernel, dim3((unsigned)query_tiles, (unsigned)a.f.heads),
              dim3(ra_bwd::THREADS), ra__cuda_bwd_smem(a.f.d, a.f.dv), s, a);
    return st;
}
