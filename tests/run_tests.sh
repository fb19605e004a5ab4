#!/usr/bin/env bash
# Configure, build and test ringattn from a fresh checkout; works from any directory.
#   bash tests/run_tests.sh              Release build in build/, then ctest (the Python package's
#                                        tests among them); with nvcc, also the CUDA build in
#                                        build-cuda/ and its GPU tests
#   bash tests/run_tests.sh --sanitize   ASan+UBSan RelWithDebInfo build in build-asan/, then ctest
#                                        (C and C++ tests only)
# Installs missing apt packages first (cmake/install-deps.sh), and the Python tests' virtual
# environment with this checkout's package (cmake/python-env.sh). Exits with ctest's status.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

sanitize=0
for arg in "$@"; do
    case "$arg" in
        --sanitize) sanitize=1 ;;
        -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
        *) echo "run_tests.sh: unknown argument: $arg (expected --sanitize)" >&2; exit 2 ;;
    esac
done

bash cmake/install-deps.sh

jobs="$(nproc 2>/dev/null || echo 2)"
# Explicit ON: a build directory configured earlier with tests, bench or examples OFF would
# otherwise keep them off and ctest would find nothing to run.
parts=(-DRINGATTN_BUILD_TESTS=ON -DRINGATTN_BUILD_BENCH=ON -DRINGATTN_BUILD_EXAMPLES=ON -DRINGATTN_ENABLE_MPI=ON)
if [[ $sanitize -eq 1 ]]; then
    build=build-asan
    cmake -S . -B "$build" "${parts[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGATTN_SANITIZE=ON
    export ASAN_OPTIONS=detect_leaks=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
else
    build=build
    # the Python tests run the package as a user installs it (pip install ./python)
    python_bin="$(bash cmake/python-env.sh | tail -n 1)"
    cmake -S . -B "$build" "${parts[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_SANITIZE=OFF \
        -DRINGATTN_PYTHON_TESTS="$python_bin"
fi
cmake --build "$build" -j "$jobs"

status=0

# The CUDA build first, wherever nvcc is (so that the main suite's summary is the last thing
# printed): the same library with the kernels compiled by nvcc for sm_80 and sm_90 (a register
# spill is a build error), the NCCL transport and its MPI helper, linked, with the mpirun demo,
# and its GPU tests, which skip with the reason printed when no GPU is visible. The emulated
# CUDA backend runs in the main suite below.
nvcc_bin="$(command -v nvcc || true)"
[[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [[ $sanitize -eq 0 && -n "$nvcc_bin" ]]; then
    cuda_build=build-cuda
    cmake -S . -B "$cuda_build" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_ENABLE_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DRINGATTN_BUILD_TESTS=ON -DRINGATTN_BUILD_EMU=OFF \
        -DRINGATTN_BUILD_BENCH=OFF -DRINGATTN_BUILD_EXAMPLES=ON -DRINGATTN_ENABLE_MPI=ON \
        -DRINGATTN_ENABLE_NCCL=ON
    # every library test is registered for the GPU (<test>_cuda); without one, CI builds and
    # runs (skips) the CUDA backend's own: the rest compile in the main build below
    gpu_tests=(test_cuda_attention test_cuda_errors test_cache test_nan_inputs test_faults_threads
               test_cuda_ring test_cuda_nccl)
    cmake --build "$cuda_build" -j "$jobs" --target ringattn ring_attention "${gpu_tests[@]}"
    gpu_regex="^($(IFS='|'; echo "${gpu_tests[*]}"))_cuda\$|^test_cuda_sass\$"
    (cd "$cuda_build" && ctest -R "$gpu_regex" -V --no-tests=error) || status=$?
elif [[ $sanitize -eq 0 ]]; then
    echo "run_tests.sh: no nvcc: the CUDA build is skipped (the emulated CUDA backend runs below)"
fi

# both cores: tests that need the machine to themselves are RUN_SERIAL (python, multinode)
(cd "$build" && ctest -j "$jobs" --output-on-failure --no-tests=error) || status=$?
exit "$status"
