// The fake CUDA runtime's memory and devices (fake_runtime.h): device memory is host memory
// this file allocated, on one of two devices of one kind (RA_EMU_DEVICE), so that a plan on
// another device than the caller's current one is testable (streams and launches are shared:
// one executor).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "emu/cuda_emu.h"
#include "emu/fake_state.h"

using namespace ra_emu::fake;

namespace {

struct Allocation {
    size_t bytes;
    int device;
};
std::map<void *, Allocation> allocations;
constexpr int device_count = 2;
thread_local int current_device = 0;

} // namespace

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    if (!p) return note(cudaErrorInvalidValue);
    // 256-byte aligned, as cudaMalloc's (the counters' sectors of a tensor's start)
    void *m = std::aligned_alloc(256, ((bytes ? bytes : 1) + 255) / 256 * 256);
    if (!m) return note(cudaErrorMemoryAllocation);
    std::memset(m, 0xff, bytes); // fresh device memory reads NaN, as a poisoned test expects
    Guard lk;
    allocations[m] = Allocation{bytes, current_device};
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    Guard lk;
    drain(all_empty); // as cudaFree synchronises the device
    if (!allocations.erase(p)) return note(cudaErrorInvalidDevicePointer);
    std::free(p);
    return cudaSuccess;
}

namespace {

// The allocation holding [p, p + bytes), or allocations.end().
std::map<void *, Allocation>::iterator allocation_of(const void *p, size_t bytes)
{
    auto it = allocations.upper_bound(const_cast<void *>(p));
    if (it == allocations.begin()) return allocations.end();
    --it;
    const char *base = static_cast<const char *>(it->first), *q = static_cast<const char *>(p);
    return q >= base && q + bytes <= base + it->second.bytes ? it : allocations.end();
}

} // namespace

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    if (!a) return note(cudaErrorInvalidValue);
    Guard lk;
    const auto it = p ? allocation_of(p, 1) : allocations.end();
    const bool dev = it != allocations.end();
    *a = cudaPointerAttributes{dev ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered,
                               dev ? it->second.device : -2, dev ? const_cast<void *>(p) : nullptr,
                               nullptr};
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t s)
{
    Guard lk;
    if (bytes && allocation_of(src, bytes) == allocations.end()) { // pageable host memory
        auto staged = std::make_shared<std::vector<unsigned char>>(
            static_cast<const unsigned char *>(src), static_cast<const unsigned char *>(src) + bytes);
        stream_of(s)->queue.push_back(Op{[=] { std::memcpy(dst, staged->data(), bytes); }});
        return cudaSuccess;
    }
    stream_of(s)->queue.push_back(Op{[=] { std::memmove(dst, src, bytes); }});
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    Guard lk;
    cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
    return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    Guard lk;
    stream_of(s)->queue.push_back(Op{[=] { std::memset(dst, value, bytes); }});
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) { return *n = device_count, cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { return *d = current_device, cudaSuccess; }
cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= device_count) return note(cudaErrorInvalidValue);
    current_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (!p || device < 0 || device >= device_count) return note(cudaErrorInvalidValue);
    const ra_emu::DeviceModel &m = ra_emu::device_model();
    *p = cudaDeviceProp{};
    std::snprintf(p->name, sizeof p->name, "%s (ringattn SIMT emulation)", m.name);
    p->totalGlobalMem = m.global_bytes;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = m.smem_optin;
    p->sharedMemPerMultiprocessor = m.smem_per_sm;
    p->l2CacheSize = m.l2_bytes;
    p->major = m.major, p->minor = m.minor, p->multiProcessorCount = m.sms, p->warpSize = 32;
    p->maxThreadsPerBlock = 1024, p->regsPerBlock = 65536;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (!value || device < 0 || device >= device_count) return note(cudaErrorInvalidValue);
    const ra_emu::DeviceModel &m = ra_emu::device_model();
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = m.sms; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)m.smem_optin; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)m.smem_per_sm; return cudaSuccess;
    }
    return note(cudaErrorInvalidValue);
}

const ra_emu::DeviceModel &ra_emu::device_model()
{
    static const DeviceModel h200{"NVIDIA H200", 9, 0, 132, (size_t)141 << 30, 50 << 20, 228 * 1024,
                                  max_dynamic_smem};
    static const DeviceModel a100{"NVIDIA A100-SXM4-80GB", 8, 0, 108, (size_t)80 << 30, 40 << 20,
                                  164 * 1024, 163 * 1024};
    static const DeviceModel *chosen = [] {
        const char *env = std::getenv("RA_EMU_DEVICE");
        return env && std::strcmp(env, "a100") == 0 ? &a100 : &h200;
    }();
    return *chosen;
}
