/*
 * Runtime ISA dispatch of the CPU kernels' element-wise loops (exp, softmax, conversions,
 * masks): a library built without -march=native (RINGATTN_NATIVE=OFF, as packages are) compiles
 * each hot function for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA, F16C) and baseline x86-64,
 * and the loader picks the clone the CPU runs (GCC's target_clones, an ifunc per function). The
 * tile products are OpenBLAS's, which dispatches on its own. Each clone's results are fixed,
 * so runs on one machine stay bitwise repeatable (SPEC 9); another ISA may round differently.
 */
#ifndef RINGATTN_KERNELS_CPU_ISA_H
#define RINGATTN_KERNELS_CPU_ISA_H

#if defined(RINGATTN_CPU_DISPATCH)
/* GCC exports a clone's ifunc symbol whatever -fvisibility says: cmake/ringattn.map hides it */
#define RA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RA_CPU_CLONES
#endif

#endif
