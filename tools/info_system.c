/* ringattn-info's CPU, BLAS and GPU lines (tools/info.h). */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info.h"

/* The CPU's model and the instruction sets the CPU kernels look for, and the BLAS the library
   was loaded with (OpenBLAS names its kernels; found by name in this process). */
void info_print_cpu(void)
{
    char model[256] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    for (char line[512]; f && fgets(line, sizeof line, f);)
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    if (f) fclose(f);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    printf("CPU: %s; avx2 %s, avx512f %s, avx512bf16 %s, avx512fp16 %s\n", model,
           __builtin_cpu_supports("avx2") ? "yes" : "no",
           __builtin_cpu_supports("avx512f") ? "yes" : "no",
           __builtin_cpu_supports("avx512bf16") ? "yes" : "no",
           __builtin_cpu_supports("avx512fp16") ? "yes" : "no");
#else
    printf("CPU: %s\n", model);
#endif
    char *(*config)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_config");
    char *(*core)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
    if (config && core) {
        const char *forced = getenv("OPENBLAS_CORETYPE");
        printf("BLAS: %s, kernels %s%s%s%s\n", config(), core(),
               forced ? " (OPENBLAS_CORETYPE=" : "", forced ? forced : "", forced ? ")" : "");
    } else {
        printf("BLAS: not OpenBLAS (no openblas_get_config in this process)\n");
    }
}

/* The visible GPUs through the CUDA driver API, if it is installed. */
void info_print_gpus(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        printf("GPUs: none visible (no CUDA driver: libcuda.so.1 not found)\n");
        return;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(cuda, "cuDeviceGetCount");
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(cuda, "cuDeviceGet");
    int (*name)(char *, int, int) = (int (*)(char *, int, int))dlsym(cuda, "cuDeviceGetName");
    int (*mem)(size_t *, int) = (int (*)(size_t *, int))dlsym(cuda, "cuDeviceTotalMem_v2");
    int (*version)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
    int n = 0, v = 0;
    if (!init || !count || !get || !name || init(0) != 0 || count(&n) != 0) {
        printf("GPUs: none visible (the CUDA driver did not initialise)\n");
        dlclose(cuda);
        return;
    }
    if (version) version(&v);
    printf("GPUs: %d visible (CUDA driver %d.%d)\n", n, v / 1000, v % 1000 / 10);
    for (int i = 0; i < n; ++i) {
        int dev = 0;
        char buf[256] = "?";
        size_t bytes = 0;
        get(&dev, i);
        name(buf, sizeof buf, dev);
        if (mem) mem(&bytes, dev);
        printf("  %d: %s, %.1f GiB\n", i, buf, (double)bytes / (1u << 30));
    }
    dlclose(cuda);
}
