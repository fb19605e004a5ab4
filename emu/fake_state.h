// The fake CUDA runtime's shared state (fake_runtime.cpp: streams and events; fake_memory.cpp:
// allocations and devices; fake_nccl.cpp): one lock for the emulated device, the queued
// operations of a stream, and the drain. Internal to the emulation.
#pragma once

#include <deque>
#include <functional>
#include <mutex>

#include "emu/cuda_emu.h"

struct ra_emu_event {
    unsigned long recorded = 0;  // records enqueued so far
    unsigned long completed = 0; // records that have run
};

namespace ra_emu::fake {

// One queued operation: runs, or waits for an event's record to have run, or (gate: another
// party's work, the fake NCCL's) runs once gate() holds.
struct Op {
    std::function<void()> run;
    ra_emu_event *wait = nullptr;
    unsigned long until = 0; // the event's record count it waits for
    std::function<bool()> gate = nullptr;
};

} // namespace ra_emu::fake

struct ra_emu_stream {
    int id;
    std::deque<ra_emu::fake::Op> queue;
    bool capturing = false; // between cudaStreamBeginCapture and cudaStreamEndCapture
};

namespace ra_emu::fake {

extern std::recursive_mutex mu;  // the emulated device: one stream operation at a time
extern thread_local int depth;   // how many times this thread holds mu (a drain may let it go)
extern cudaError_t sticky, last; // a failed kernel's error (sticky) and the last call's

struct Guard {
    Guard() { mu.lock(), ++depth; }
    ~Guard() { --depth, mu.unlock(); }
    Guard(const Guard &) = delete;
    Guard &operator=(const Guard &) = delete;
};

ra_emu_stream *stream_of(cudaStream_t s); // nullptr: the default stream
// Runs queued operations by the drain policy until done() holds (mu held).
cudaError_t drain(const std::function<bool()> &done);
bool all_empty();
cudaError_t note(cudaError_t e); // records e as the last error, returns it

} // namespace ra_emu::fake
