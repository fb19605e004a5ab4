#include "emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RA_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define RA_EMU_ASAN 1
#endif
#ifdef RA_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace ra_emu {

namespace {

thread_local void *scheduler_sp = nullptr;  // x86-64: the scheduler's saved stack pointer
#if !defined(__x86_64__)
thread_local ucontext_t scheduler_ctx;
#endif
#ifdef RA_EMU_ASAN
thread_local void *scheduler_asan_fake = nullptr;
thread_local const void *scheduler_stack_bottom = nullptr;
thread_local size_t scheduler_stack_size = 0;
#endif

size_t page() { return (size_t)sysconf(_SC_PAGESIZE); }

} // namespace

#if defined(__x86_64__)
// ra_emu_switch(void **save, void *load): saves the callee-saved state on the current stack and
// its stack pointer in *save, then resumes the stack `load` (System V ABI: rdi, rsi).
extern "C" void ra_emu_switch(void **save, void *load);
extern "C" void ra_emu_trampoline();
asm(R"(
    .text
    .globl ra_emu_switch
    .type ra_emu_switch, @function
ra_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ra_emu_switch, .-ra_emu_switch

    .globl ra_emu_trampoline
    .type ra_emu_trampoline, @function
ra_emu_trampoline:
    movq %r12, %rdi
    andq $-16, %rsp
    call ra_emu_fiber_entry
    ud2
    .size ra_emu_trampoline, .-ra_emu_trampoline
)");

extern "C" void ra_emu_fiber_entry(Fiber *f)
{
#ifdef RA_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
    f->entry(f->arg); // ends in fiber_to_scheduler, never resumed
    std::abort();
}
#else
static void ucontext_entry(unsigned lo, unsigned hi)
{
    Fiber *f = (Fiber *)(((uintptr_t)hi << 32) | lo);
#ifdef RA_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
    f->entry(f->arg);
    std::abort();
}
#endif

namespace {

// Freed stacks, kept for the next launch: every launch makes a block's worth of fibers on each
// worker, and mapping (and faulting in) fresh stacks each time cost more than the kernels.
std::mutex cache_mu;
std::vector<std::pair<char *, size_t>> cached; // (mapping, usable bytes)
constexpr size_t cache_max = 4096;

} // namespace

bool fiber_alloc(Fiber &f, size_t bytes)
{
    const size_t pg = page(), usable = (bytes + pg - 1) / pg * pg;
    {
        std::lock_guard<std::mutex> lk(cache_mu);
        for (size_t i = cached.size(); i-- > 0;)
            if (cached[i].second == usable) {
                f.stack = cached[i].first;
                f.stack_bytes = usable;
                cached[i] = cached.back();
                cached.pop_back();
#if !defined(__x86_64__)
                f.ctx = new ucontext_t;
#endif
                return true;
            }
    }
    void *m = mmap(nullptr, usable + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    mprotect(m, pg, PROT_NONE); // the guard page: an overflow faults, it does not corrupt
    f.stack = (char *)m;
    f.stack_bytes = usable;
#if !defined(__x86_64__)
    f.ctx = new ucontext_t;
#endif
    return true;
}

void fiber_reset(Fiber &f, void (*entry)(void *), void *arg)
{
    const size_t pg = page();
    const size_t usable = f.stack_bytes;
    f.entry = entry;
    f.arg = arg;
    f.asan_fake = nullptr;
#ifdef RA_EMU_ASAN
    // frames a failed block abandoned on this stack keep their poisoning: start clean
    ASAN_UNPOISON_MEMORY_REGION(f.stack + pg, usable);
#endif
    char *top = f.stack + pg + usable;
#if defined(__x86_64__)
    // the frame ra_emu_switch pops: fpu control words, r15..rbp (r12 = the fiber), return
    uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15);
    *--sp = 0;                                  // alignment slot
    *--sp = (uint64_t)(uintptr_t)ra_emu_trampoline;
    for (int i = 0; i < 6; ++i) *--sp = 0;      // rbp rbx r12 r13 r14 r15 (pushed in order)
    sp[3] = (uint64_t)(uintptr_t)&f;            // r12: popped 4th from the bottom
    uint32_t mxcsr;
    uint16_t fcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fcw));
    sp -= 2;
    ((uint16_t *)sp)[0] = fcw;
    ((uint32_t *)sp)[2] = mxcsr;
    f.sp = sp;
#else
    ucontext_t *uc = (ucontext_t *)f.ctx;
    getcontext(uc);
    uc->uc_stack.ss_sp = f.stack + pg;
    uc->uc_stack.ss_size = usable;
    uc->uc_link = nullptr;
    const uintptr_t p = (uintptr_t)&f;
    makecontext(uc, (void (*)())ucontext_entry, 2, (unsigned)p, (unsigned)(p >> 32));
#endif
}

void fiber_free(Fiber &f)
{
    if (f.stack) {
        std::lock_guard<std::mutex> lk(cache_mu);
        if (cached.size() < cache_max) cached.emplace_back(f.stack, f.stack_bytes);
        else munmap(f.stack, f.stack_bytes + page());
    }
#if !defined(__x86_64__)
    delete (ucontext_t *)f.ctx;
#endif
    f = Fiber();
}

void fiber_from_scheduler(Fiber &f)
{
#ifdef RA_EMU_ASAN
    __sanitizer_start_switch_fiber(&scheduler_asan_fake, f.stack + page(), f.stack_bytes);
#endif
#if defined(__x86_64__)
    ra_emu_switch(&scheduler_sp, f.sp);
#else
    swapcontext(&scheduler_ctx, (ucontext_t *)f.ctx);
#endif
#ifdef RA_EMU_ASAN
    __sanitizer_finish_switch_fiber(scheduler_asan_fake, nullptr, nullptr);
#endif
}

// Switches from fiber f back to the scheduler; asan_save: where ASan keeps f's fake stack
// (NULL: f has finished, ASan drops it).
static void switch_out(Fiber &f, void **asan_save)
{
#ifdef RA_EMU_ASAN
    __sanitizer_start_switch_fiber(asan_save, scheduler_stack_bottom, scheduler_stack_size);
#else
    (void)asan_save;
#endif
#if defined(__x86_64__)
    ra_emu_switch(&f.sp, scheduler_sp);
#else
    swapcontext((ucontext_t *)f.ctx, &scheduler_ctx);
#endif
}

void fiber_exit_to_scheduler(Fiber &f)
{
    switch_out(f, nullptr);
    std::abort(); // never resumed
}

void fiber_to_scheduler(Fiber &f)
{
    switch_out(f, &f.asan_fake);
#ifdef RA_EMU_ASAN
    __sanitizer_finish_switch_fiber(f.asan_fake, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
}

} // namespace ra_emu
