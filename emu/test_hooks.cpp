// Hooks for tests that reach the emulation only through a library built on it: they find these
// by name (dlsym), as they find the runtime API, and do without them on a GPU.
#include "emu/counters.h"
#include "emu/cuda_emu.h"

#define RA_EMU_HOOK extern "C" __attribute__((visibility("default")))

// The block scheduling policy of this thread's later launches and the streams' drain order,
// together. 0: round robin, in order; 1: random (seeded) for both; 2: highest thread first,
// reverse.
RA_EMU_HOOK void ra_emu_set_schedule(int kind, unsigned long long seed)
{
    using namespace ra_emu;
    const Policy p[] = {Policy::round_robin, Policy::random, Policy::highest_first};
    const Drain d[] = {Drain::in_order, Drain::random, Drain::reverse};
    const int k = kind >= 0 && kind < 3 ? kind : 0;
    set_policy(p[k], seed);
    set_drain_policy(d[k], seed);
}

// The next kernel launch faults when it runs (a sticky error, as an illegal address on a GPU:
// every later call fails until cudaDeviceReset).
RA_EMU_HOOK void ra_emu_inject_fault() { ra_emu::fail_next_launch_for_test(); }

// The performance counters (counters.h) on or off for later launches (RA_EMU_COUNTERS sets the
// default), and the last launch's JSON line into buf[cap] (its length; cap 0: only the length).
RA_EMU_HOOK void ra_emu_counters(int on) { ra_emu::counting_on = ra_emu::counters_print = on != 0; }
RA_EMU_HOOK size_t ra_emu_counters_last(char *buf, size_t cap)
{
    const std::string s = ra_emu::counters_last();
    if (cap) {
        const size_t n = s.size() < cap - 1 ? s.size() : cap - 1;
        std::memcpy(buf, s.data(), n);
        buf[n] = '\0';
    }
    return s.size();
}
