// The CUDA backend's host side (kernels/backend.h), shared by its files: the workspace -- the
// plan's kernel params mirrored to the device once -- the error mapping, and the launchers.
// The driver makes the plan's device current around everything it asks of the backend
// (set_device), so none of this switches devices itself.
// Compiled by nvcc for the GPU build and by g++ over the SIMT emulation for CI (device.cuh
// chooses). Internal.
#pragma once

#include "kernels/cuda/backward_common.cuh"
#include "kernels/cuda/forward_launch.cuh"

extern "C" {
#include "base/memory_ops.h"
#include "base/error.h"
#include "base/call_stream.h"
#include "kernels/backend.h"
}

// A tile list (masks/tiles.h) on the device: its items heaviest first, and their runs.
struct ra_cuda_tiles {
    const ra_tile_item *items;
    const ra_tile_run *runs;
    int count; // items: the blocks of a launch
};

// One key shard's segments on the device, and the tile lists of the local queries against it:
// the plan's (the forward's tiles), and the backward's query-major and key-major lists of its
// own tiles (none in a forward-only plan).
struct ra_cuda_keys {
    const ra_segment *segs;
    ra_cuda_tiles fwd, bwd_q, bwd_k;
};

struct ra_cuda_ws {
    int device;               // the plan's device: every call runs there
    // in one device allocation, written once at plan creation
    void *arena;
    size_t bytes;
    const int64_t *delta;     // [num_seqs]
    const float *alibi;       // [H] or NULL
    const ra_segment *qsegs;  // the local queries' segments
    ra_cuda_keys *keys;       // host array [num_key_shards] of device arrays
    float *absmax;            // [4]: the call's scan (SPEC 9), max |Q| and |K| read by the
                              // kernels, then (a ring's backward) the lossy row count
    float *rows;              // [3, H, local rows]: the backward prologue's D_i, shift, scale
    float *zstate;            // [2, D_v blocks, H, local rows]: a ring's (m, l) when D_v > 128
    // the tensor-core backward (bf16, f16 with D, D_v <= 128; backward_tc.cuh): its slices'
    // float32 copies of dQ, [slices, H, local rows, D]; slices 0: the SIMT passes run
    float *dq_slices;
    int slices;
};

static inline ra_cuda_ws *ra__cuda_ws(struct ra_workspace *ws) { return (ra_cuda_ws *)ws; }

// Whether a plan's steps run the tensor-core kernel with softcap, ALiBi and key bias compiled in
// (its tiles differ: ra__cuda_query_tile), decided once from the plan.
static inline bool ra__cuda_full_features(const ra_kernel_params *p)
{
    return p->softcap > 0.0f || p->alibi != nullptr || p->bias_heads > 0;
}

// A device's attribute (device -1: the current one), or 0 where the runtime does not say (the
// error cleared: not sticky).
static inline int ra__cuda_attribute(cudaDeviceAttr attr, int device)
{
    int v = 0;
    if ((device < 0 && cudaGetDevice(&device) != cudaSuccess) ||
        cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return v;
}

// Whether a plan's backward runs on tensor cores (backward_tc.cuh: bf16, f16, head dims up to
// 256, its shared memory within the device's block), else on the SIMT kernels.
static inline bool ra__cuda_bwd_on_tensor_cores(const ra_kernel_params *p)
{
    if (p->dtype == RINGATTN_FLOAT32 || p->head_dim > 256 || p->head_dim_v > 256) return false;
    const size_t optin = (size_t)ra__cuda_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, p->device);
    return ra__cuda_bwd_tc_smem(p->head_dim, p->head_dim_v, ra__cuda_full_features(p),
                                p->high_precision != 0, optin) <= optin;
}

// A failed runtime call as RINGATTN_ERR_CUDA, its message naming what failed and why.
ringattn_status_t ra__cuda_fail(cudaError_t e, const char *what);
#define RA_CUDA_TRY(call, what)                                 \
    do {                                                        \
        const cudaError_t ra_cuda_e_ = (call);                  \
        if (ra_cuda_e_ != cudaSuccess) return ra__cuda_fail(ra_cuda_e_, what); \
    } while (0)

// The call's stream (the caller's, carried on the plan's call stream; NULL: the default).
static inline cudaStream_t ra__cuda_stream(void *stream)
{
    return (cudaStream_t)ra__call_stream_device(stream);
}

// Element kernels' launch shape: RA_CUDA_THREADS per block, grid-stride loops past 4096 blocks.
constexpr int RA_CUDA_THREADS = 256;
inline unsigned ra__cuda_blocks_for(size_t n)
{
    const size_t b = (n + RA_CUDA_THREADS - 1) / RA_CUDA_THREADS;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

// kernels/cuda/merge.cu: inference's float32 partials and their SPEC 5 merge (backend.h).
ringattn_status_t ra__cuda_state_partial(struct ra_workspace *ws, const ra_kernel_params *prm,
                                         const ra_fwd_io *io, float *part);
ringattn_status_t ra__cuda_merge_f32(const ra_kernel_params *prm, const float *parts, int n,
                                     size_t stride, const float *sinks, const ra_view *o,
                                     float *lse, void *stream);

// kernels/cuda/memory.cu: the backend's memory and element work.
ringattn_status_t ra__cuda_alloc(size_t bytes, void **ptr);
void ra__cuda_free(void *ptr);
ringattn_status_t ra__cuda_copy(const ra_copy *c, void *stream);
ringattn_status_t ra__cuda_add_f32(float *dst, const float *src, size_t n, void *stream);
ringattn_status_t ra__cuda_scan(struct ra_workspace *ws, const ra_kernel_params *prm,
                                const ra_scan_io *io, ra_scan *out);
ringattn_status_t ra__cuda_scan_agreed(struct ra_workspace *ws, const ra_kernel_params *prm,
                                       const ra_scan *agreed, void *stream);
extern "C" const ra_memory_ops ra__cuda_memory; // the backend's and a device comm's
