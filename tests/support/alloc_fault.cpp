#include "support/alloc_fault.hpp"

#include <cstdint>
#include <cstdlib>

namespace {
// static TLS of the executable: reading it never allocates
thread_local size_t fail_from = SIZE_MAX;
thread_local long refused_here = 0;
} // namespace

namespace allocfault {
#if defined(__SANITIZE_ADDRESS__)
bool available() { return false; }
#else
bool available() { return true; }
#endif
void arm(size_t min_bytes)
{
    refused_here = 0;
    fail_from = min_bytes;
}
void disarm() { fail_from = SIZE_MAX; }
long refused() { return refused_here; }
} // namespace allocfault

#if !defined(__SANITIZE_ADDRESS__)
extern "C" void *__libc_malloc(size_t);
extern "C" void *__libc_calloc(size_t, size_t);
extern "C" void *__libc_realloc(void *, size_t);
extern "C" void *__libc_memalign(size_t, size_t);

static bool fail_now(size_t bytes)
{
    if (bytes < fail_from) return false;
    ++refused_here;
    return true;
}
extern "C" void *malloc(size_t n) { return fail_now(n) ? nullptr : __libc_malloc(n); }
extern "C" void *calloc(size_t a, size_t b)
{
    return fail_now(b && a > SIZE_MAX / b ? SIZE_MAX : a * b) ? nullptr : __libc_calloc(a, b);
}
extern "C" void *realloc(void *p, size_t n) { return fail_now(n) ? nullptr : __libc_realloc(p, n); }
extern "C" void *aligned_alloc(size_t a, size_t n) { return fail_now(n) ? nullptr : __libc_memalign(a, n); }
extern "C" void *memalign(size_t a, size_t n) { return fail_now(n) ? nullptr : __libc_memalign(a, n); }
extern "C" int posix_memalign(void **p, size_t a, size_t n)
{
    if (fail_now(n)) return 12; // ENOMEM
    *p = __libc_memalign(a, n);
    return *p ? 0 : 12;
}
#endif
