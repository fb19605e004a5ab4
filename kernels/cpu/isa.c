/* Which instruction set the CPU kernels run on (isa.h), and their bfloat16 products. */
#include <pthread.h>
#include <stdio.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
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

static char kernels[160];

static void describe(void)
{
    snprintf(kernels, sizeof kernels, "%s; bfloat16 tile products: %s", element_loops(),
             ra__cpu_bf16_products(RINGATTN_BFLOAT16)
                 ? "AVX512-BF16"
                 : (ra__gemm_bf16_supported() ? "float32 sgemm (RINGATTN_CPU_BF16=0)"
                                              : "float32 sgemm (no AVX512-BF16)"));
}

const char *ringattn_cpu_kernels(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, describe);
    return kernels;
}
