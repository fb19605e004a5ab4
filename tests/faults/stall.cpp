// Faults inside the kernel: this test executable defines cblas_sgemm, which the library's
// reference resolves to (the executable is linked with its symbols exported), and forwards to
// the BLAS library's own after the stall the calling thread asked for. Every tile product must
// then go through cblas_sgemm: RINGATTN_CPU_GEMM=blas keeps the CPU backend off its own
// AVX-512 kernels, which it takes on some CPUs (kernels/cpu/blas.c).
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <cblas.h>

#include "faults/fault_harness.hpp"

namespace {
// before main, so before any plan (its workspace reads it) and in every rank under mpirun
__attribute__((constructor)) void tile_products_through_sgemm()
{
    setenv("RINGATTN_CPU_GEMM", "blas", 1);
}
thread_local double stall_seconds = 0;
thread_local int stall_calls = 0, kill_countdown = 0;
} // namespace

namespace faults {
void stall_sgemm(double seconds, int calls)
{
    stall_seconds = seconds;
    stall_calls = calls;
}
void kill_in_sgemm(int kill_at) { kill_countdown = kill_at; }
} // namespace faults

using sgemm_fn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint,
                          float, const float *, blasint, const float *, blasint, float, float *,
                          blasint);

extern "C" void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m,
                            blasint n, blasint k, float alpha, const float *a, blasint lda,
                            const float *b, blasint ldb, float beta, float *c, blasint ldc)
{
    static const sgemm_fn real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (kill_countdown > 0 && --kill_countdown == 0) raise(SIGKILL);
    if (stall_calls > 0) {
        --stall_calls;
        std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds));
    }
    real(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
