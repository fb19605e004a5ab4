#!/usr/bin/env bash
# Build ringattn (Release, in build/) and run the demo with its default arguments.
# Installs missing apt packages first (cmake/install-deps.sh). Works from any directory.
# Extra arguments are passed to the demo, e.g.: bash examples/run_demo.sh --seq 8192 --dtype bf16
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The demo: ring attention over 4 MPI ranks (examples/ring_attention), one thread each. mpirun
# as root needs --allow-run-as-root, and more ranks than cores need --oversubscribe. The
# single-rank demo is one line away:
#   demo=(build/examples/local_attention)
demo=(mpirun -n 4 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1
      build/examples/ring_attention)

options=(-DCMAKE_BUILD_TYPE=Release -DRINGATTN_BUILD_EXAMPLES=ON)
if [[ "${demo[0]}" == mpirun ]]; then
    options+=(-DRINGATTN_ENABLE_MPI=ON)
fi

bash cmake/install-deps.sh
cmake -S . -B build "${options[@]}"
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target ringattn_examples
# Debian's OpenBLAS 0.3.21 falls back to its generic Prescott kernels on CPUs it does not
# recognise (some virtual machines report a generic model), several times slower. Unless the
# caller chose, pick the kernels matching the CPU's ISA when that happened.
if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
    core="$(OPENBLAS_VERBOSE=2 build/examples/local_attention --help 2>&1 | sed -n 's/^Core: //p')"
    if grep -qw avx512f /proc/cpuinfo && [[ "$core" =~ ^(Prescott|Haswell|Zen)$ ]]; then
        export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo && [[ "$core" == Prescott ]]; then
        export OPENBLAS_CORETYPE=Haswell
    fi
    if [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then
        echo "run_demo: OpenBLAS chose its $core kernels; using OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
    fi
fi
# mpirun hands its environment to the ranks it starts on this machine; -x also exports the
# choice to ranks on other machines.
if [[ "${demo[0]}" == mpirun && -n "${OPENBLAS_CORETYPE:-}" ]]; then
    demo=("${demo[0]}" -x OPENBLAS_CORETYPE "${demo[@]:1}")
fi
echo "+ ${demo[*]} $*"
exec "${demo[@]}" "$@"
