// The Catch2 main shared by every test executable but the MPI ones (catch_session.cpp).
// A test registered for a real GPU (RATEST_GPU=1, the nvcc build's _cuda tests) is skipped --
// exit code 77, with the reason printed -- when the machine has no usable CUDA device. The
// probe runs in a child process: a process that has initialised CUDA cannot fork ranks that use
// it (tests/cuda/test_cuda_nccl.cpp forks its NCCL ranks).
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "support/catch_session.hpp"

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

// gpu_missing() in a child process; a failed fork counts as missing, said so.
int gpu_missing_probed_apart()
{
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        const int missing = gpu_missing();
        std::fflush(stdout);
        _exit(missing);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
        std::printf("skipped: the CUDA probe process failed\n");
        return 1;
    }
    return WEXITSTATUS(st);
}

} // namespace

int main(int argc, char **argv)
{
    const char *gpu = std::getenv("RATEST_GPU");
    if (gpu && std::strcmp(gpu, "1") == 0 && gpu_missing_probed_apart()) return 77;
    return ra_catch_run(argc, argv);
}
