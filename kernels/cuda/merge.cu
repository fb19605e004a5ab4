// Inference's partials (kernels/backend.h: state_partial, merge_f32): the running state a KV
// cache plan's forward steps left, as a normalised float32 partial, and the SPEC 5 merge of
// several such partials into O and LSE. One thread per (query row, head), grid-stride; the row
// math is softmax_state.h's, the CPU backend's own.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/softmax_state.h"

namespace {

// SPEC 4 finalise of (m, l, acc) into part: O [rows, H, D_v] then LSE [H, rows]. The kernels'
// state is head-major, acc [H, rows, D_v]; m, l are the steps' (the first D_v block's copy when
// D_v > 128: every block computes the same logits).
__global__ void partial_kernel(const float *m, const float *l, const float *acc, int64_t rows,
                               int heads, int dv, float *part)
{
    const int64_t n = rows * heads;
    float *lse = part + n * dv;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = i / rows, t = i % rows;
        ra__state_finalize(m[i], l[i], -INFINITY, acc + i * dv, dv, part + (t * heads + h) * dv,
                           &lse[i]); // the sink: at the merge
    }
}

// SPEC 5 over n partials at parts + s * stride into O (dtype: 0 float32, 1 bfloat16, 2
// float16; 16-bit D_v is a multiple of 8 on this backend, so columns go in pairs) and LSE.
__global__ void merge_kernel(const float *parts, int n, int64_t stride, int64_t rows, int heads,
                             int dv, const float *sinks, ra_view o, int dtype, float *out_lse)
{
    const int64_t count = rows * heads;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = i / rows, t = i % rows;
        const float *lse = parts + count * dv + i, *po = parts + (t * heads + h) * dv;
        float mx;
        float total = ra__merge_total(n, lse, stride, &mx);
        if (sinks) total = ra__merge_add_sink(sinks[h], &mx, total);
        char *row = o.data + (size_t)(t * o.row + h * o.head) * o.elem;
        for (int c = 0; c < dv; c += dtype ? 2 : 1) {
            const float a = total > 0.0f ? ra__merge_column(n, lse, stride, po + c, stride, mx, total)
                                         : ra__merge_no_column(total);
            if (!dtype) {
                reinterpret_cast<float *>(row)[c] = a;
                continue;
            }
            const float b = total > 0.0f
                                ? ra__merge_column(n, lse, stride, po + c + 1, stride, mx, total)
                                : ra__merge_no_column(total);
            reinterpret_cast<uint32_t *>(row)[c / 2] = ra_pack_16x2(dtype == 1, a, b);
        }
        out_lse[i] = ra__merge_lse(mx, total);
    }
}

} // namespace

ringattn_status_t ra__cuda_state_partial(struct ra_workspace *wsp, const ra_kernel_params *p,
                                         const ra_fwd_io *io, float *part)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    const int64_t rows = p->queries->rows;
    const size_t n = (size_t)rows * p->num_heads;
    if (!n) return RINGATTN_SUCCESS;
    // cuda_attend_forward keeps (m, l) per D_v block in zstate when D_v > 128
    const int zb = ra__cuda_dim_v_blocks(p->head_dim_v);
    const float *m = zb > 1 ? ws->zstate : io->m;
    const float *l = zb > 1 ? ws->zstate + (size_t)zb * n : io->l;
    int st;
    RA_LAUNCH(st, partial_kernel, dim3(ra__cuda_blocks_for(n)), dim3(RA_CUDA_THREADS), 0,
              ra__cuda_stream(io->stream), m, l, io->acc, rows, p->num_heads, p->head_dim_v,
              part);
    RA_CUDA_TRY((cudaError_t)st, "partial kernel launch");
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cuda_merge_f32(const ra_kernel_params *p, const float *parts, int n,
                                     size_t stride, const float *sinks, const ra_view *o,
                                     float *lse, void *stream)
{
    const int64_t rows = p->queries->rows;
    const size_t count = (size_t)rows * p->num_heads;
    if (!count) return RINGATTN_SUCCESS;
    const int dtype = p->dtype == RINGATTN_FLOAT32 ? 0 : p->dtype == RINGATTN_BFLOAT16 ? 1 : 2;
    int st;
    RA_LAUNCH(st, merge_kernel, dim3(ra__cuda_blocks_for(count)), dim3(RA_CUDA_THREADS), 0,
              ra__cuda_stream(stream), parts, n, (int64_t)stride, rows, p->num_heads,
              p->head_dim_v, sinks, *o, dtype, lse);
    RA_CUDA_TRY((cudaError_t)st, "merge kernel launch");
    return RINGATTN_SUCCESS;
}
