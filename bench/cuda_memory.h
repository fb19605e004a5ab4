/*
 * Device memory for the benchmarks' --backend cuda: the CUDA runtime the library under test
 * brings (the emulated build exports its fake one) or the benchmark links (CUDA builds), found
 * by name, so one C program serves every build. Header-only; bench/ only.
 */
#ifndef RINGATTN_BENCH_CUDA_MEMORY_H
#define RINGATTN_BENCH_CUDA_MEMORY_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*copy)(void *, const void *, size_t, int); /* kind 4: cudaMemcpyDefault */
    int (*sync)(void);
} cuda_memory_t;

/* 0 when the runtime's calls are found, else 1 with the reason on stderr. */
static inline int cuda_memory_load(cuda_memory_t *m, const char *who) {
    *(void **)&m->malloc_ = dlsym(RTLD_DEFAULT, "cudaMalloc");
    *(void **)&m->free_ = dlsym(RTLD_DEFAULT, "cudaFree");
    *(void **)&m->copy = dlsym(RTLD_DEFAULT, "cudaMemcpy");
    *(void **)&m->sync = dlsym(RTLD_DEFAULT, "cudaDeviceSynchronize");
    if (m->malloc_ && m->free_ && m->copy && m->sync) return 0;
    fprintf(stderr, "%s: --backend cuda: no CUDA runtime is loaded (a library built with "
                    "RINGATTN_ENABLE_CUDA=ON, or the emulated one of tests/emu)\n", who);
    return 1;
}

/* A device copy of bytes at host (NULL host: uninitialised), or NULL on failure. */
static inline void *cuda_memory_upload(const cuda_memory_t *m, const void *host, size_t bytes) {
    void *d = NULL;
    if (m->malloc_(&d, bytes ? bytes : 16) != 0) return NULL;
    if (host && m->copy(d, host, bytes, 4) != 0) {
        m->free_(d);
        return NULL;
    }
    return d;
}

#endif
