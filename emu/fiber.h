// Cooperative fibers for the SIMT emulation (DESIGN: CUDA: the SIMT emulation): each emulated CUDA
// thread of a block is a fiber on the worker's OS thread, with its own mmap'ed stack and a guard
// page. On x86-64 a switch saves only the callee-saved registers, MXCSR and the x87 control word
// (about 20 ns); elsewhere ucontext (portable, several times slower). Under AddressSanitizer every
// switch is announced, so ASan follows the stacks. Internal to the emulation.
#pragma once

#include <cstddef>

namespace ra_emu {

struct Fiber {
    void *sp = nullptr;          // saved stack pointer while switched out (x86-64)
    void *ctx = nullptr;         // ucontext_t (fallback)
    char *stack = nullptr;       // the mapping, guard page first
    size_t stack_bytes = 0;      // usable bytes above the guard page
    void (*entry)(void *) = nullptr;
    void *arg = nullptr;
    void *asan_fake = nullptr;   // ASan's fake stack of this fiber while switched out
};

// A stack of `bytes` (rounded up to pages) for f; false when no memory could be mapped.
bool fiber_alloc(Fiber &f, size_t bytes);
// Makes f (its stack allocated) run entry(arg) from the start when next switched to.
void fiber_reset(Fiber &f, void (*entry)(void *), void *arg);
void fiber_free(Fiber &f);

// The scheduler's own context on this OS thread switches to f, and f back to the scheduler.
// A fiber whose entry returned must never be resumed (the scheduler marks it done first: the
// entry ends with fiber_to_scheduler and never returns).
void fiber_from_scheduler(Fiber &f);
void fiber_to_scheduler(Fiber &f);
// The last switch of a fiber that has finished (ASan drops its fake stack).
void fiber_exit_to_scheduler(Fiber &f);

} // namespace ra_emu
