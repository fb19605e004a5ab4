// Hooks for tests that reach the emulation only through a library built on it: they find these
// by name (dlsym), as they find the runtime API, and do without them on a GPU.
#include "kernels/cuda/emu/cuda_emu.h"

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
