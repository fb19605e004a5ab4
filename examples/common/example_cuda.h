/*
 * example_cuda.h: the CUDA runtime calls the examples' and benchmarks' --backend cuda make,
 * found by name in the runtime the library under test brings (the emulated library of build/emu
 * exports its fake one) or the program links (CUDA builds). So one C program serves a CPU-only
 * build (it says --backend cuda is not available), a CUDA build on a GPU, and the emulation in
 * CI. A program of your own would call the runtime directly. Header-only.
 */
#ifndef RINGATTN_EXAMPLE_CUDA_H
#define RINGATTN_EXAMPLE_CUDA_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*copy)(void *, const void *, size_t, int); /* kind 4: cudaMemcpyDefault */
    int (*sync)(void);
    int (*stream_create)(void **);
    int (*stream_sync)(void *);
    int (*stream_destroy)(void *);
    int (*device_count)(int *);
    int (*set_device)(int);
} cuda_memory_t;

/* 0 when the runtime's calls are found, else 1 with the reason on stderr. */
static inline int cuda_memory_load(cuda_memory_t *m, const char *who) {
    *(void **)&m->malloc_ = dlsym(RTLD_DEFAULT, "cudaMalloc");
    *(void **)&m->free_ = dlsym(RTLD_DEFAULT, "cudaFree");
    *(void **)&m->copy = dlsym(RTLD_DEFAULT, "cudaMemcpy");
    *(void **)&m->sync = dlsym(RTLD_DEFAULT, "cudaDeviceSynchronize");
    *(void **)&m->stream_create = dlsym(RTLD_DEFAULT, "cudaStreamCreate");
    *(void **)&m->stream_sync = dlsym(RTLD_DEFAULT, "cudaStreamSynchronize");
    *(void **)&m->stream_destroy = dlsym(RTLD_DEFAULT, "cudaStreamDestroy");
    *(void **)&m->device_count = dlsym(RTLD_DEFAULT, "cudaGetDeviceCount");
    *(void **)&m->set_device = dlsym(RTLD_DEFAULT, "cudaSetDevice");
    if (m->malloc_ && m->free_ && m->copy && m->sync && m->stream_create && m->stream_sync &&
        m->stream_destroy && m->device_count && m->set_device)
        return 0;
    fprintf(stderr, "%s: --backend cuda: no CUDA runtime is loaded (a library built with "
                    "RINGATTN_ENABLE_CUDA=ON, or the emulated one of build/emu)\n", who);
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
