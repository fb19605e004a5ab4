// A small fake CUDA runtime for the emulation (DESIGN: CUDA: the SIMT emulation), so that a
// backend's host code -- memory, copies, streams, events, launches -- runs in CI: device memory is
// host memory; a stream is a deferred FIFO queue, drained only at synchronisation points (a
// stream, event or device synchronisation, a blocking copy) in the order of a drain policy. Two
// streams without an event between them then run in different orders under different policies, and
// a missing event shows as a bitwise difference. Device properties are an H200's; launches check
// the 227 KiB dynamic shared-memory limit. Two such devices: each allocation belongs to the
// calling thread's current one (cudaSetDevice), while streams and launches are shared. Included by
// cuda_emu.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
    cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
typedef struct ra_emu_graph *cudaGraph_t;
typedef struct ra_emu_stream *cudaStream_t;
typedef struct ra_emu_event *cudaEvent_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor,
        l2CacheSize;
    int major, minor, multiProcessorCount, warpSize, maxThreadsPerBlock, regsPerBlock;
};

// The runtime API has C linkage, as CUDA's (a test finds cudaMalloc by name).
extern "C" {
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
// Device memory here is host memory the fake runtime allocated; any other address is a host
// pointer (cudaMemoryTypeUnregistered), as plain malloc memory is to CUDA.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
// Host to device from host memory copies the source when it is called (CUDA stages pageable
// memory before it returns), so the caller may reuse it at once; everything else runs in
// stream order.
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
// Flags and priorities are accepted and have no effect here: every stream is drained by policy.
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaDeviceSynchronize();
// Drains every stream and clears a sticky error (the emulation's tests go on after a failure).
cudaError_t cudaDeviceReset();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
// The devices are H200s, or A100s under RA_EMU_DEVICE=a100 (their SMs' shared memory and
// count: what a launcher that sizes its kernels by the device sees).
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaStreamQuery(cudaStream_t s);
// Capture as a state of the stream only (a test of a caller that captures): nothing is
// recorded, the graph is NULL, work queued meanwhile runs as usual.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
} // extern "C"

namespace ra_emu {
// A kernel's dynamic shared-memory opt-in: launches above 48 KiB without one fail, as on a GPU.
cudaError_t set_smem_optin(const void *kernel, int bytes);
bool smem_allowed(const void *kernel, size_t bytes);
} // namespace ra_emu

template <class T> cudaError_t cudaFuncSetAttribute(T *kernel, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return ra_emu::set_smem_optin(reinterpret_cast<const void *>(kernel), value);
}

namespace ra_emu {

// The order in which queued work of several streams runs when a synchronisation drains them:
// the lowest-numbered stream with runnable work first, the highest first, one operation from
// each in turn, or at random (seeded).
enum class Drain { in_order, reverse, round_robin, random };
void set_drain_policy(Drain d, uint64_t seed = 0);

// Enqueues a launch on stream s (nullptr: the default stream, a stream like any other here).
// A bad configuration is an error now (cudaGetLastError); a failure while the kernel runs
// (deadlock, divergence, ...) is sticky: the next synchronisation returns it, and last_error()
// says what it was.
cudaError_t enqueue_launch(cudaStream_t s, dim3 grid, dim3 block, size_t smem,
                           std::function<void()> body, const char *kernel = "kernel");

// Another party's operation on stream s (the fake NCCL's): run() in stream order once gate()
// holds (both called with the runtime held). A drain that finds only such work not ready lets
// the runtime go and waits for other threads (ranks) to let it through (RA_EMU_WAIT_S).
cudaError_t enqueue_gated(cudaStream_t s, std::function<bool()> gate, std::function<void()> run);

// The next launch faults when it runs (test_hooks.cpp: ra_emu_inject_fault).
void fail_next_launch_for_test();

} // namespace ra_emu
