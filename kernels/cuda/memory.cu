// The CUDA backend's memory and element work (kernels/backend.h): the memory table (device
// memory, host copies, streams and events: base/memory_ops.h), copies between strided views
// (float32 sums into the storage dtype), float32 adds, the SPEC 9 input scan, in the call's
// stream order. Nothing here waits for the device except copy_to_host, which must.
#include "kernels/cuda/cuda_backend.h"

#include <cstdio>
#include <cstring>

ringattn_status_t ra__cuda_fail(cudaError_t e, const char *what)
{
    const char *detail = ra_device_error_detail();
    return ra__fail(RINGATTN_ERR_CUDA, "ringattn: CUDA: %s: %s (error %d)%s%s", what,
                    cudaGetErrorString(e), (int)e, detail[0] ? ": " : "", detail);
}

ringattn_status_t ra__cuda_alloc(size_t bytes, void **ptr)
{
    const cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 16);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); // not sticky: the caller may free memory and try again
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of device memory (%zu bytes)",
                        bytes);
    }
    RA_CUDA_TRY(e, "cudaMalloc");
    return RINGATTN_SUCCESS;
}

void ra__cuda_free(void *ptr) { cudaFree(ptr); }

namespace {

// The memory table's entries take raw streams (a cudaStream_t; base/memory_ops.h).
ringattn_status_t raw_zero(void *dst, size_t bytes, void *stream)
{
    if (bytes) RA_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream), "cudaMemsetAsync");
    return RINGATTN_SUCCESS;
}

// Pageable host memory: CUDA has read it when the call returns, so the caller may reuse it.
ringattn_status_t raw_from_host(void *dst, const void *host, size_t bytes, void *stream)
{
    if (bytes)
        RA_CUDA_TRY(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream),
                    "cudaMemcpyAsync (host to device)");
    return RINGATTN_SUCCESS;
}

ringattn_status_t raw_to_host(void *host, const void *src, size_t bytes, void *stream)
{
    if (!bytes) return RINGATTN_SUCCESS;
    RA_CUDA_TRY(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream),
                "cudaMemcpyAsync (device to host)");
    RA_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
    return RINGATTN_SUCCESS;
}

} // namespace

namespace {

// The offset in elements of element i of a rows x heads x dim walk (row-major) over view v.
__device__ __forceinline__ int64_t walk_at(const ra_view &v, int64_t i, int heads, int dim)
{
    return i / ((int64_t)heads * dim) * v.row + i / dim % heads * v.head + i % dim;
}

// rows x heads x dim elements, one thread per element (grid-stride): a plain copy of 16-bit or
// 32-bit elements, or float32 into the 16-bit dtype (bf16: to_bf16).
__global__ void copy_kernel(ra_view src, ra_view dst, int64_t rows, int heads, int dim, int convert,
                            int to_bf16)
{
    const int64_t n = rows * heads * dim;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t so = walk_at(src, i, heads, dim), d = walk_at(dst, i, heads, dim);
        if (convert)
            reinterpret_cast<uint16_t *>(dst.data)[d] = (uint16_t)(
                ra_pack_16x2(to_bf16 != 0, reinterpret_cast<const float *>(src.data)[so], 0.0f) &
                0xffffu);
        else if (dst.elem == 4)
            reinterpret_cast<uint32_t *>(dst.data)[d] = reinterpret_cast<const uint32_t *>(src.data)[so];
        else
            reinterpret_cast<uint16_t *>(dst.data)[d] = reinterpret_cast<const uint16_t *>(src.data)[so];
    }
}

__global__ void add_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

// max |x| over rows x heads x dim elements (float32, or bfloat16: the upper half of a float32;
// float16 is bounded and never scanned) into *out as float bits (non-negative floats order
// as their bits, and NaN above every one, so a NaN input gives NaN, as SPEC 9 wants): atomicMax
// of the same values in any order gives the same bits.
__global__ void absmax_kernel(ra_view v, int64_t rows, int heads, int dim, unsigned *out)
{
    const int64_t n = rows * heads * dim;
    unsigned best = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t at = walk_at(v, i, heads, dim);
        const unsigned bits = v.elem == 4 ? reinterpret_cast<const unsigned *>(v.data)[at]
                                          : (unsigned)reinterpret_cast<const uint16_t *>(v.data)[at] << 16;
        const unsigned mag = bits & 0x7fffffffu;
        best = mag > best ? mag : best;
    }
    atomicMax(out, best);
}

// (head, row) pairs whose LSE is lossy (ra__lse_lossy, SPEC 9) into *count.
__global__ void lossy_kernel(const float *lse, size_t n, unsigned *count)
{
    unsigned mine = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        mine += ra__lse_lossy(lse[i]) ? 1u : 0u;
    if (mine) atomicAdd(count, mine);
}

} // namespace

ringattn_status_t ra__cuda_copy(const ra_copy *c, void *stream)
{
    RA_CHECK(c->src_dtype == c->dst_dtype || c->src_dtype == RINGATTN_FLOAT32,
             RINGATTN_ERR_INTERNAL, "ringattn: copy from dtype %d to %d", (int)c->src_dtype,
             (int)c->dst_dtype);
    const size_t n = (size_t)c->rows * c->heads * c->dim;
    if (!n) return RINGATTN_SUCCESS;
    int st;
    RA_LAUNCH(st, copy_kernel, dim3(ra__cuda_blocks_for(n)), dim3(RA_CUDA_THREADS), 0, ra__cuda_stream(stream),
              *c->src, *c->dst, c->rows, c->heads, c->dim, c->src_dtype != c->dst_dtype,
              c->dst_dtype == RINGATTN_BFLOAT16);
    RA_CUDA_TRY((cudaError_t)st, "copy kernel launch");
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cuda_add_f32(float *dst, const float *src, size_t n, void *stream)
{
    if (!n) return RINGATTN_SUCCESS;
    int st;
    RA_LAUNCH(st, add_kernel, dim3(ra__cuda_blocks_for(n)), dim3(RA_CUDA_THREADS), 0, ra__cuda_stream(stream), dst,
              src, n);
    RA_CUDA_TRY((cudaError_t)st, "add kernel launch");
    return RINGATTN_SUCCESS;
}

// SPEC 9's scan, on the device: max |Q| and max |K| (float16 is bounded: never scanned) into
// ws->absmax, and in a backward the lossy LSE rows. On one rank the kernels read the maxima
// there and decide whether Q is scaled before the product, so that a call never waits for the
// device; in a ring the values go to the host for the call's agreement (the one wait).
ringattn_status_t ra__cuda_scan(struct ra_workspace *wsp, const ra_kernel_params *p,
                                const ra_scan_io *io, ra_scan *out)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    *out = ra_scan{0.0f, 0.0f, 0, !io->ring};
    const cudaStream_t s = ra__cuda_stream(io->stream);
    RA_CUDA_TRY(cudaMemsetAsync(ws->absmax, 0, 4 * sizeof(float), s), "cudaMemsetAsync");
    const struct {
        const ra_view *v;
        int64_t rows;
        int heads;
    } in[2] = {{io->q, io->q_rows, p->num_heads}, {io->k, io->k_rows, p->num_kv_heads}};
    for (int i = 0; i < 2 && p->dtype != RINGATTN_FLOAT16; ++i) {
        const size_t n = (size_t)in[i].rows * in[i].heads * p->head_dim;
        if (!n) continue;
        int st;
        RA_LAUNCH(st, absmax_kernel, dim3(ra__cuda_blocks_for(n)), dim3(RA_CUDA_THREADS), 0, s, *in[i].v, in[i].rows,
                  in[i].heads, p->head_dim, reinterpret_cast<unsigned *>(ws->absmax + i));
        RA_CUDA_TRY((cudaError_t)st, "scan kernel launch");
    }
    if (!io->ring) return RINGATTN_SUCCESS; // a backward's stats pass finds the lossy rows
    unsigned *lossy = reinterpret_cast<unsigned *>(ws->absmax + 2);
    const size_t rows = (size_t)p->num_heads * (size_t)io->q_rows;
    if (io->lse && rows) {
        int st;
        RA_LAUNCH(st, lossy_kernel, dim3(ra__cuda_blocks_for(rows)), dim3(RA_CUDA_THREADS), 0, s, io->lse, rows,
                  lossy);
        RA_CUDA_TRY((cudaError_t)st, "scan kernel launch");
    }
    float host[3];
    RA_TRY(raw_to_host(host, ws->absmax, sizeof host, s));
    unsigned count;
    std::memcpy(&count, &host[2], sizeof count);
    *out = ra_scan{host[0], host[1], (int64_t)count, 0};
    return RINGATTN_SUCCESS;
}

// The ring's agreement into the maxima the kernels read (the local max |Q|, the ring's max |K|).
ringattn_status_t ra__cuda_scan_agreed(struct ra_workspace *wsp, const ra_kernel_params *p,
                                       const ra_scan *agreed, void *stream)
{
    if (agreed->on_device || p->dtype == RINGATTN_FLOAT16) return RINGATTN_SUCCESS;
    const float both[2] = {agreed->q_absmax, agreed->k_absmax};
    return raw_from_host(ra__cuda_ws(wsp)->absmax, both, sizeof both, ra__cuda_stream(stream));
}

static int set_device(int device)
{
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) return -1;
    if (device >= 0 && device != previous && cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError(); // not sticky; the call's first runtime error will say more
        return -1;
    }
    return previous;
}

// The rest of the memory table: streams and events of the device.
namespace {

ringattn_status_t raw_record(void *event, void *stream)
{
    RA_CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), "cudaEventRecord");
    return RINGATTN_SUCCESS;
}

ringattn_status_t raw_wait(void *stream, void *event)
{
    RA_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0),
                "cudaStreamWaitEvent");
    return RINGATTN_SUCCESS;
}

ringattn_status_t stream_create(void **stream)
{
    int least = 0, greatest = 0; // the transport's copies go ahead of queued kernels
    RA_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    cudaStream_t s;
    RA_CUDA_TRY(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest),
                "cudaStreamCreateWithPriority");
    *stream = s;
    return RINGATTN_SUCCESS;
}

void stream_destroy(void *stream) { cudaStreamDestroy((cudaStream_t)stream); }

ringattn_status_t event_create(void **event)
{
    cudaEvent_t e;
    RA_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    *event = e;
    return RINGATTN_SUCCESS;
}

void event_destroy(void *event) { cudaEventDestroy((cudaEvent_t)event); }

ringattn_status_t copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    RA_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                "cudaMemcpyAsync (device to device)");
    return RINGATTN_SUCCESS;
}

ringattn_status_t event_query(void *event, int *done)
{
    const cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) return RINGATTN_SUCCESS;
    RA_CUDA_TRY(e, "cudaEventQuery");
    return RINGATTN_SUCCESS;
}

ringattn_status_t stream_capturing(void *stream, int *capturing)
{
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    RA_CUDA_TRY(cudaStreamIsCapturing((cudaStream_t)stream, &status), "cudaStreamIsCapturing");
    *capturing = status != cudaStreamCaptureStatusNone;
    return RINGATTN_SUCCESS;
}

ra_memory_ops memory_table()
{
    ra_memory_ops d{};
    d.name = "CUDA";
    d.set_device = set_device;
    d.stream_create = stream_create;
    d.stream_destroy = stream_destroy;
    d.event_create = event_create;
    d.event_destroy = event_destroy;
    d.event_record = raw_record;
    d.stream_wait = raw_wait;
    d.copy_async = copy_async;
    d.event_query = event_query;
    d.alloc = ra__cuda_alloc;
    d.free = ra__cuda_free;
    d.zero = raw_zero;
    d.copy_from_host = raw_from_host;
    d.copy_to_host = raw_to_host;
    d.stream_capturing = stream_capturing;
    return d;
}

} // namespace

extern "C" const ra_memory_ops ra__cuda_memory = memory_table();
