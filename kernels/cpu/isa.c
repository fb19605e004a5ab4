/* Which instruction set the CPU kernels' element-wise loops run on (isa.h). */
#include "kernels/cpu/isa.h"
#include "ringattn.h"

const char *ringattn_cpu_kernels(void)
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
