// The SIMT emulation's state of one running block, shared by the scheduler (scheduler.cpp) and
// the warp collectives (warp.cpp). Internal to the emulation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "emu/cuda_emu.h"
#include "emu/fiber.h"

namespace ra_emu {

enum class State { runnable, at_barrier, at_warp, done };

// A deferred cp.async: its 16 source bytes, landed at the wait that covers its group.
struct PendingCopy {
    void *dst;
    unsigned char bytes[16];
    int group;
};

struct Thread {
    Fiber fiber;
    int tid = 0; // linear index in the block
    State state = State::runnable;
    Site site{};           // where it waits (or exited)
    uint32_t out[8] = {};  // its result of the last warp collective
    std::vector<PendingCopy> copies;
    int open_group = 0;    // cp.async groups committed so far
    int landed_groups = 0; // of which have landed (the counters' groups in flight)
};

// A warp collective some lanes have reached and others not yet.
struct Pending {
    Collective op;
    unsigned mask = 0, arrived = 0;
    int param = 0;
    Site site{};
    uint32_t in[32][10];
};

struct CounterState; // counters.cpp

struct Block {
    std::vector<Thread> threads;
    int nthreads = 0;
    int barrier_arrived = 0;
    Site barrier_site{};
    std::vector<std::vector<Pending>> warps; // per warp: collectives in progress
    unsigned char *smem = nullptr;           // dynamic shared memory of this block
    size_t smem_bytes = 0;
    Thread *current = nullptr;
    std::string error; // set: the block stops; the launch fails with it
    bool unwinding = false; // after an error: every parked thread is resumed to unwind
    CounterState *counters = nullptr; // while counting (counters.h)
};

// Thrown through a thread's kernel frames when its block failed, caught at the fiber's base,
// so that every destructor on an emulated thread's stack runs.
struct Unwind {};

Block &block(); // the block running on this worker

// Fails the running block with the message (the launch reports it): unwinds this thread.
[[noreturn]] void fail_block(const std::string &msg);
// Parks the current thread in `state` at `site` until the scheduler resumes it (throws Unwind
// when it is resumed because the block failed).
void park(State state, Site site);

std::string site_str(const Site &s);

} // namespace ra_emu
