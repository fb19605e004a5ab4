// Allocation failures on demand: a test executable compiled with alloc_fault.cpp takes the
// place of libc's allocator entry points for the whole process (the library's calls, and the
// emulated CUDA runtime's cudaMalloc, included). While a thread has armed it, allocations that
// thread makes of at least min_bytes fail. ASan has its own allocator, which this would bypass:
// under ASan nothing is interposed and available() is false.
#pragma once

#include <cstddef>

namespace allocfault {

bool available();
// From now on this thread's allocations of at least min_bytes (0: every one) fail. No Catch2
// assertion while armed: they allocate.
void arm(size_t min_bytes = 0);
void disarm();
// Allocations refused on this thread since it last armed.
long refused();

} // namespace allocfault
