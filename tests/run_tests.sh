#!/usr/bin/env bash
# Configure, build and test ringattn from a fresh checkout; works from any directory.
#   bash tests/run_tests.sh              Release build in build/, then ctest
#   bash tests/run_tests.sh --sanitize   ASan+UBSan RelWithDebInfo build in build-asan/, then ctest
# Installs missing apt packages first (cmake/install-deps.sh). Exits with ctest's status.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

sanitize=0
for arg in "$@"; do
    case "$arg" in
        --sanitize) sanitize=1 ;;
        -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
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
    cmake -S . -B "$build" "${parts[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_SANITIZE=OFF
fi
cmake --build "$build" -j "$jobs"

cd "$build"
status=0
ctest --output-on-failure --no-tests=error || status=$?
exit "$status"
