/*
 * OpenMP's thread queries, or one thread in a build without OpenMP (RINGATTN_WITH_OPENMP=OFF:
 * the pragmas are then ignored and every tile runs on the calling thread). Internal.
 */
#ifndef RINGATTN_KERNELS_CPU_THREADS_H
#define RINGATTN_KERNELS_CPU_THREADS_H

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif

#endif
