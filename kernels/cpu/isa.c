/* Which instruction set the CPU kernels run on (isa.h), and what their tile products run on. */
#include <pthread.h>
#include <stdio.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
#include "kernels/backends.h"
#include "ringattn.h"

static const char *element_loops(void)
{
#if defined(RINGATTN_CPU_DISPATCH)
    /* the order target_clones' resolver tries them in: the highest level the CPU supports */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512), chosen at run time";
    if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2, FMA), chosen at run time";
    return "x86-64 (SSE2), chosen at run time";
#elif defined(RINGATTN_CPU_NATIVE)
    return "native (-march=native at build time)";
#else
    return "the compiler's default target (no runtime dispatch)";
#endif
}

static char kernels[200];

#ifdef RINGATTN_HAVE_BLAS
#define RA_FALLBACK_PRODUCTS "BLAS sgemm"
#else
#define RA_FALLBACK_PRODUCTS "plain loops (a build without BLAS)"
#endif

static void describe(void)
{
    const int own = ra__cpu_f32_products(), bf16 = ra__cpu_bf16_products(RINGATTN_BFLOAT16);
    snprintf(kernels, sizeof kernels, "%s; tile products: float32 %s, bfloat16 %s%s",
             element_loops(), own ? "AVX-512 (ringattn's)" : RA_FALLBACK_PRODUCTS,
             bf16 ? "AVX512-BF16" : "as float32",
#ifdef _OPENMP
             "");
#else
             "; one thread (a build without OpenMP)");
#endif
}

const char *ra__cpu_kernels(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, describe);
    return kernels;
}
