// One compiled Catch2 main shared by every test executable (catch.hpp's main is slow to build).
// A test registered for a real GPU (RATEST_GPU=1, the nvcc build's _cuda tests) is skipped --
// exit code 77, with the reason printed -- when the machine has no usable CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// 0 when a CUDA device is usable, else prints why not.
int gpu_missing()
{
    using count_fn = int (*)(int *);
    using string_fn = const char *(*)(int);
    const auto count = reinterpret_cast<count_fn>(dlsym(RTLD_DEFAULT, "cudaGetDeviceCount"));
    const auto str = reinterpret_cast<string_fn>(dlsym(RTLD_DEFAULT, "cudaGetErrorString"));
    if (!count) {
        std::printf("skipped: RATEST_GPU=1 but no CUDA runtime is loaded\n");
        return 1;
    }
    int n = 0;
    const int e = count(&n);
    if (e != 0 || n == 0) {
        std::printf("skipped: no CUDA device is visible (%s)\n",
                    e ? (str ? str(e) : "error") : "0 devices");
        return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    const char *gpu = std::getenv("RATEST_GPU");
    if (gpu && std::strcmp(gpu, "1") == 0 && gpu_missing()) return 77;
    return Catch::Session().run(argc, argv);
}
