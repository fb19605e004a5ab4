// The fake CUDA runtime (fake_runtime.h): deferred streams drained by policy, events as
// dependencies between them (fake_state.h; memory and devices: fake_memory.cpp).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "emu/cuda_emu.h"
#include "emu/emu_internal.h"
#include "emu/fake_state.h"

namespace ra_emu::fake {

std::recursive_mutex mu;
thread_local int depth = 0;
cudaError_t sticky = cudaSuccess, last = cudaSuccess;

} // namespace ra_emu::fake

using namespace ra_emu::fake;

namespace {

std::vector<ra_emu_stream *> streams; // live streams by id; [0] is the default stream
std::map<const void *, int> smem_optin; // kernel -> its opt-in bytes
constexpr size_t default_smem = 48 * 1024;
ra_emu::Drain drain_policy = ra_emu::Drain::in_order;
uint64_t drain_rng = 0;
int last_picked = -1;
bool fail_next_launch = false;

ra_emu_stream default_stream{0, {}};

} // namespace

namespace ra_emu::fake {

ra_emu_stream *stream_of(cudaStream_t s)
{
    if (streams.empty()) streams.push_back(&default_stream);
    return s ? s : streams[0];
}

bool ready(const ra_emu_stream *s)
{
    if (s->queue.empty()) return false;
    const Op &op = s->queue.front();
    if (op.gate) return op.gate();
    return !op.wait || op.wait->completed >= op.until;
}

// Is some stream held up by another party's work (a gate), which other threads may still let
// through?
bool gated()
{
    for (const ra_emu_stream *s : streams)
        if (s && !s->queue.empty() && s->queue.front().gate) return true;
    return false;
}

double wait_limit_s() // read once: drain asks at every idle pass
{
    static const double limit = [] {
        const char *env = std::getenv("RA_EMU_WAIT_S");
        const double s = env ? std::atof(env) : 0.0;
        return s > 0 ? s : 120.0;
    }();
    return limit;
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

// Drains until done() holds; a cycle of waits that can never run is an error. Work gated on
// another party (the fake NCCL's messages) is waited for with the runtime let go, so that the
// other ranks' threads can queue what it waits for, up to RA_EMU_WAIT_S seconds (default 120).
cudaError_t drain(const std::function<bool()> &done)
{
    auto since = std::chrono::steady_clock::now();
    while (!done()) {
        if (step()) {
            since = std::chrono::steady_clock::now();
            continue;
        }
        const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
        if (!gated() || idle > wait_limit_s()) {
            std::fprintf(stderr, gated() ? "ra_emu: streams wait %g s for messages nobody sends\n"
                                         : "ra_emu: streams wait on each other in a cycle\n",
                         idle);
            return sticky = cudaErrorLaunchFailure;
        }
        const int held = depth;
        for (int i = 0; i < held; ++i) mu.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        for (int i = 0; i < held; ++i) mu.lock();
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

} // namespace ra_emu::fake

namespace ra_emu {

void set_drain_policy(Drain d, uint64_t seed)
{
    Guard lk;
    drain_policy = d;
    drain_rng = seed;
}

cudaError_t set_smem_optin(const void *kernel, int bytes)
{
    Guard lk;
    if (bytes < 0 || (size_t)bytes > device_model().smem_optin) return note(cudaErrorInvalidValue);
    smem_optin[kernel] = bytes;
    return cudaSuccess;
}

bool smem_allowed(const void *kernel, size_t bytes)
{
    Guard lk;
    if (bytes <= default_smem) return true;
    const auto it = smem_optin.find(kernel);
    if (it != smem_optin.end() && bytes <= (size_t)it->second) return true;
    note(cudaErrorInvalidValue);
    return false;
}

cudaError_t enqueue_gated(cudaStream_t s, std::function<bool()> gate, std::function<void()> run)
{
    Guard lk;
    stream_of(s)->queue.push_back(Op{std::move(run), nullptr, 0, std::move(gate)});
    return cudaSuccess;
}

cudaError_t enqueue_launch(cudaStream_t s, dim3 grid, dim3 block, size_t smem,
                           std::function<void()> body, const char *kernel)
{
    Guard lk;
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
        if (launch(grid, block, smem, body, kernel) != 0 && sticky == cudaSuccess)
            sticky = cudaErrorLaunchFailure;
        set_policy(outer);
    }});
    return cudaSuccess;
}

} // namespace ra_emu

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    if (!s) return note(cudaErrorInvalidValue);
    Guard lk;
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
    Guard lk;
    if (!s || s->id <= 0 || s->id >= (int)streams.size() || streams[(size_t)s->id] != s)
        return note(cudaErrorInvalidResourceHandle);
    drain([s] { return s->queue.empty(); }); // queued work still runs, as in CUDA
    streams[(size_t)s->id] = nullptr;
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    Guard lk;
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
    Guard lk;
    drain(all_empty);
    return delete e, cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e) return note(cudaErrorInvalidResourceHandle);
    Guard lk;
    ++e->recorded;
    stream_of(s)->queue.push_back(Op{[e] { ++e->completed; }});
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    if (!e) return note(cudaErrorInvalidResourceHandle);
    Guard lk;
    // waits for the event's latest record at the time of this call (none: no wait)
    stream_of(s)->queue.push_back(Op{nullptr, e, e->recorded});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    Guard lk;
    const unsigned long want = e->recorded;
    return note(drain([e, want] { return e->completed >= want; }));
}

// A query lets the device run what is ready (a GPU runs on while the host polls), never waits.
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    Guard lk;
    while (e->completed < e->recorded && step()) {}
    return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize()
{
    Guard lk;
    return note(drain(all_empty));
}

cudaError_t cudaDeviceReset()
{
    Guard lk;
    drain(all_empty);
    sticky = last = cudaSuccess;
    return cudaSuccess;
}

cudaError_t cudaGetLastError()
{
    Guard lk;
    const cudaError_t e = last != cudaSuccess ? last : sticky;
    last = cudaSuccess; // a sticky error stays (as a failed context's does)
    return e;
}

cudaError_t cudaPeekAtLastError()
{
    Guard lk;
    return last != cudaSuccess ? last : sticky;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    Guard lk;
    return stream_of(s)->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode)
{
    Guard lk;
    if (!s || stream_of(s)->capturing) return last = cudaErrorInvalidValue;
    stream_of(s)->capturing = true;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    Guard lk;
    if (!s || !stream_of(s)->capturing) return last = cudaErrorInvalidValue;
    stream_of(s)->capturing = false;
    *graph = nullptr;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
    Guard lk;
    *status = stream_of(s)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

namespace ra_emu {

void fail_next_launch_for_test()
{
    Guard lk;
    fail_next_launch = true;
}

} // namespace ra_emu
