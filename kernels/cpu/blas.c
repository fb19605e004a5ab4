/* How the CPU backend lives with OpenBLAS: thread count during a pass, kernel sanity. */
#include <cblas.h>
#include <pthread.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "base/log.h"

/*
 * OpenBLAS built with pthreads would start its own threads inside every tile product of our
 * OpenMP threads; tiles are small, so run BLAS single-threaded while a pass runs.
 */
#ifdef OPENBLAS_VERSION
void ra__cpu_blas_single_thread_begin(int *saved)
{
    *saved = openblas_get_num_threads();
    if (*saved != 1) openblas_set_num_threads(1);
}
void ra__cpu_blas_single_thread_end(int saved)
{
    if (saved != 1) openblas_set_num_threads(saved);
}

/* Older OpenBLAS builds do not recognise newer CPUs and fall back to the SSE3 "Prescott"
   kernels, 4x slower than what the CPU can do: say so once. */
static void check_kernel(void)
{
    const char *core = openblas_get_corename();
#if defined(__x86_64__) && defined(__GNUC__)
    if (core && (strcmp(core, "Prescott") == 0 || strcmp(core, "Core2") == 0) &&
        __builtin_cpu_supports("avx2"))
        ra__log(RA_LOG_WARN, 0, 1,
                "OpenBLAS uses its %s kernels on a CPU with AVX2%s; tile products run several "
                "times slower than they could (set OPENBLAS_CORETYPE=%s)",
                core, __builtin_cpu_supports("avx512f") ? "/AVX-512" : "",
                __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell");
#else
    (void)core;
#endif
}
#else
void ra__cpu_blas_single_thread_begin(int *saved) { *saved = 1; }
void ra__cpu_blas_single_thread_end(int saved) { (void)saved; }
static void check_kernel(void) {}
#endif

void ra__cpu_blas_check(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, check_kernel);
}
