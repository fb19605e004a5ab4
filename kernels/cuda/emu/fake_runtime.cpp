// The fake CUDA runtime (fake_runtime.h): deferred streams drained by policy, events as
// dependencies between them, host memory as device memory.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/emu/emu_internal.h"

struct ra_emu_event {
    unsigned long recorded = 0;  // records enqueued so far
    unsigned long completed = 0; // records that have run
};

namespace {

// One queued operation: runs, or waits for an event's record to have run.
struct Op {
    std::function<void()> run;
    ra_emu_event *wait = nullptr;
    unsigned long until = 0; // the event's record count it waits for
};

} // namespace

struct ra_emu_stream {
    int id;
    std::deque<Op> queue;
};

namespace {

std::recursive_mutex mu; // the emulated device: one stream operation at a time
std::vector<ra_emu_stream *> streams; // live streams by id; [0] is the default stream
struct Allocation { size_t bytes; int device; };
std::map<void *, Allocation> allocations;
// Two devices of one kind, so that a plan on another device than the caller's current one is
// testable; streams and launches are shared (the emulation has one executor).
constexpr int device_count = 2;
thread_local int current_device = 0;
std::map<const void *, int> smem_optin; // kernel -> its opt-in bytes
constexpr size_t default_smem = 48 * 1024;
ra_emu::Drain drain_policy = ra_emu::Drain::in_order;
uint64_t drain_rng = 0;
int last_picked = -1;
cudaError_t sticky = cudaSuccess, last = cudaSuccess;
bool fail_next_launch = false;

ra_emu_stream default_stream{0, {}};

ra_emu_stream *stream_of(cudaStream_t s)
{
    if (streams.empty()) streams.push_back(&default_stream);
    return s ? s : streams[0];
}

bool ready(const ra_emu_stream *s)
{
    if (s->queue.empty()) return false;
    const Op &op = s->queue.front();
    return !op.wait || op.wait->completed >= op.until;
}

// Runs one operation of some stream with runnable work, by the drain policy; false if none.
bool step()
{
    std::vector<ra_emu_stream *> can;
    for (ra_emu_stream *s : streams)
        if (s && ready(s)) can.push_back(s);
    if (can.empty()) return false;
    ra_emu_stream *s = can.front();
    switch (drain_policy) {
    case ra_emu::Drain::in_order: break;
    case ra_emu::Drain::reverse: s = can.back(); break;
    case ra_emu::Drain::round_robin:
        for (ra_emu_stream *c : can)
            if (c->id > last_picked) { s = c; break; }
        break;
    case ra_emu::Drain::random:
        drain_rng = drain_rng * 6364136223846793005ull + 1442695040888963407ull;
        s = can[(size_t)(drain_rng >> 33) % can.size()];
        break;
    }
    last_picked = s->id;
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    if (op.run) op.run();
    return true;
}

// Drains until done() holds; a cycle of waits that can never run is an error.
cudaError_t drain(const std::function<bool()> &done)
{
    while (!done())
        if (!step()) {
            std::fprintf(stderr, "ra_emu: streams wait on each other in a cycle\n");
            return sticky = cudaErrorLaunchFailure;
        }
    const cudaError_t e = sticky;
    return e;
}

cudaError_t note(cudaError_t e) { return last = e != cudaSuccess ? e : last, e; }

bool all_empty()
{
    for (ra_emu_stream *s : streams)
        if (s && !s->queue.empty()) return false;
    return true;
}

} // namespace

namespace ra_emu {

void set_drain_policy(Drain d, uint64_t seed)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    drain_policy = d;
    drain_rng = seed;
}

cudaError_t set_smem_optin(const void *kernel, int bytes)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (bytes < 0 || (size_t)bytes > max_dynamic_smem) return note(cudaErrorInvalidValue);
    smem_optin[kernel] = bytes;
    return cudaSuccess;
}

bool smem_allowed(const void *kernel, size_t bytes)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (bytes <= default_smem) return true;
    const auto it = smem_optin.find(kernel);
    if (it != smem_optin.end() && bytes <= (size_t)it->second) return true;
    note(cudaErrorInvalidValue);
    return false;
}

cudaError_t enqueue_launch(cudaStream_t s, dim3 grid, dim3 block, size_t smem,
                           std::function<void()> body)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (sticky != cudaSuccess) return note(sticky); // a failed context takes no more work
    if (fail_next_launch) { // injected by a test: the launch faults when it runs
        fail_next_launch = false;
        body = [] { ra_emu::fail_block("ra_emu: injected device fault"); };
    }
    const long n = (long)block.x * block.y * block.z;
    if (n < 1 || n > 1024 || !grid.x || !grid.y || !grid.z || smem > max_dynamic_smem)
        return note(cudaErrorInvalidConfiguration);
    const Policy p = policy(); // the launching thread's scheduling policy, at launch time
    stream_of(s)->queue.push_back(Op{[=] {
        if (sticky != cudaSuccess) return; // queued behind a fault: never runs, as on a GPU
        const Policy outer = policy();
        set_policy(p);
        if (launch(grid, block, smem, body) != 0 && sticky == cudaSuccess)
            sticky = cudaErrorLaunchFailure;
        set_policy(outer);
    }});
    return cudaSuccess;
}

} // namespace ra_emu

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    if (!p) return note(cudaErrorInvalidValue);
    void *m = std::malloc(bytes ? bytes : 1);
    if (!m) return note(cudaErrorMemoryAllocation);
    std::memset(m, 0xff, bytes); // fresh device memory reads NaN, as a poisoned test expects
    std::lock_guard<std::recursive_mutex> lk(mu);
    allocations[m] = Allocation{bytes, current_device};
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lk(mu);
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
    std::lock_guard<std::recursive_mutex> lk(mu);
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
    std::lock_guard<std::recursive_mutex> lk(mu);
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
    std::lock_guard<std::recursive_mutex> lk(mu);
    cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
    return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    stream_of(s)->queue.push_back(Op{[=] { std::memset(dst, value, bytes); }});
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    if (!s) return note(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(mu);
    stream_of(nullptr);
    *s = new ra_emu_stream{(int)streams.size(), {}};
    streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned, int) { return cudaStreamCreate(s); }

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) // an H200's range
{
    return *least = 0, *greatest = -5, cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (!s || s->id <= 0 || s->id >= (int)streams.size() || streams[(size_t)s->id] != s)
        return note(cudaErrorInvalidResourceHandle);
    drain([s] { return s->queue.empty(); }); // queued work still runs, as in CUDA
    streams[(size_t)s->id] = nullptr;
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    ra_emu_stream *st = stream_of(s);
    return note(drain([st] { return st->queue.empty(); }));
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    if (!e) return note(cudaErrorInvalidValue);
    *e = new ra_emu_event;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }

// CUDA releases an event once the work queued on it has run: queued waits still read it here
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    drain(all_empty);
    return delete e, cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e) return note(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(mu);
    ++e->recorded;
    stream_of(s)->queue.push_back(Op{[e] { ++e->completed; }});
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    if (!e) return note(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(mu);
    // waits for the event's latest record at the time of this call (none: no wait)
    stream_of(s)->queue.push_back(Op{nullptr, e, e->recorded});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    const unsigned long want = e->recorded;
    return note(drain([e, want] { return e->completed >= want; }));
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize()
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    return note(drain(all_empty));
}

cudaError_t cudaDeviceReset()
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    drain(all_empty);
    sticky = last = cudaSuccess;
    return cudaSuccess;
}

cudaError_t cudaGetLastError()
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    const cudaError_t e = last != cudaSuccess ? last : sticky;
    last = cudaSuccess; // a sticky error stays (as a failed context's does)
    return e;
}

cudaError_t cudaPeekAtLastError()
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    return last != cudaSuccess ? last : sticky;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    return stream_of(s)->queue.empty() ? cudaSuccess : cudaErrorNotReady;
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
    *p = cudaDeviceProp{};
    std::snprintf(p->name, sizeof p->name, "NVIDIA H200 (ringattn SIMT emulation)");
    p->totalGlobalMem = (size_t)141 << 30;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = ra_emu::max_dynamic_smem;
    p->l2CacheSize = 50 << 20;
    p->major = 9, p->minor = 0, p->multiProcessorCount = 132, p->warpSize = 32;
    p->maxThreadsPerBlock = 1024, p->regsPerBlock = 65536;
    return cudaSuccess;
}

namespace ra_emu {

void fail_next_launch_for_test()
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    fail_next_launch = true;
}

} // namespace ra_emu
