#!/usr/bin/env bash
# The H200 check (CUDA.md section 4): the forward tile kernel driven directly
# (bench/gpu/fwd_tile_gpu.cu: needs only nvcc), PyTorch SDPA's flash and cuDNN forward and
# backward as the anchor, then the library built with the CUDA backend for sm_90: its CUDA tests
# three times (test_cuda_attention: forward and backward against float64; test_cuda_errors;
# test_cuda_ring: the ring with ranks as threads over the device-copy transport),
# compute-sanitizer on the backward and the ring, and bench_ring_cuda (single-rank forward and
# backward TFLOP/s at T = 16K, H = 16, D = 128, bf16, causal; the one-GPU ring at P = 2, 3, 4
# against one rank), then the NCCL transport with processes on the one GPU, each with its own
# NCCL_HOSTID (test_cuda_nccl [procs]: P = 1 (self), 2 and 4 against float64, and a rank that
# leaves the call failing the other within RINGATTN_COMM_TIMEOUT; a "Duplicate GPU detected"
# refusal is a skip with its reason; the mpirun demo with --backend cuda where mpirun exists).
# One run of at most about 9 minutes; each stage under its own timeout; at most 8 files in the
# output folder (default $OUT, else ./gpu-check): env.txt kernel.txt sdpa.txt library.txt
# sanitizer.txt ring.txt nccl.txt summary.md. Without a GPU every GPU stage ends cleanly as
# "skipped" (the dry run; CHECK_DRY=1 builds the library anyway); the library stages need
# OpenBLAS and Catch2 (else skipped, with why).
#   bash bench/gpu/check.sh [OUTDIR]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-${OUT:-$PWD/gpu-check}}"
mkdir -p "$out"
exe="$out/../fwd_tile_gpu.$$" # built outside the output folder: only the 7 files come back
lib="$out/../ringattn-build.$$"
rows=()

# stage NAME LIMIT_S FILE COMMAND...: runs it (appending to FILE), records status (ok / skipped
# / FAILED) and time
stage() {
    local name="$1" limit="$2" file="$3"; shift 3
    local t0=$SECONDS rc=0
    echo "=== $name" >> "$out/$file"
    timeout "$limit" bash -c '"$@"' stage "$@" >> "$out/$file" 2>&1 || rc=$?
    local status=ok
    [[ $rc -eq 77 ]] && status=skipped
    [[ $rc -eq 124 ]] && status="FAILED (timeout ${limit}s)"
    [[ $rc -ne 0 && $rc -ne 77 && $rc -ne 124 ]] && status="FAILED (rc $rc)"
    rows+=("| $name | $status | $((SECONDS - t0)) | $file |")
    echo "check: $name: $status ($((SECONDS - t0)) s)"
    return $rc
}

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

env_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
    nvcc --version | tail -2
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())" 2>&1 || true
    have_gpu || exit 77
}

build_kernel() {
    nvcc -std=c++17 -O3 -arch=sm_90 -I"$root" -I"$root/include" -Xptxas -v \
         "$root/bench/gpu/fwd_tile_gpu.cu" -o "$exe" 2>&1 | grep -E "error|Compiling|registers|spill"
    [[ -x "$exe" ]]
}

run_built() { [[ -x "$exe" ]] || { echo "not built: skipped"; exit 77; }; "$exe" "$@"; }

# The library with the CUDA backend for sm_90, its CUDA tests and bench_ring_cuda.
build_library() { # CHECK_DRY=1: builds without a GPU too (a dry run of this stage)
    have_gpu || [[ "${CHECK_DRY:-0}" == 1 ]] || { echo "no GPU: skipped"; exit 77; }
    cmake -S "$root" -B "$lib" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_ENABLE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DRINGATTN_BUILD_EMU=OFF -DRINGATTN_ENABLE_NCCL=ON \
        -DRINGATTN_BUILD_EXAMPLES="$with_mpi" -DRINGATTN_ENABLE_MPI="$with_mpi" \
        > "$lib.configure.log" 2>&1 ||
        { echo "configure failed (OpenBLAS or Catch2 missing?): skipped"; tail -3 "$lib.configure.log"; exit 77; }
    # a register spill is a build error (-Xptxas --warn-on-spills,--warning-as-error)
    local targets=(test_cuda_attention test_cuda_errors test_cuda_ring test_cuda_nccl bench_ring_cuda)
    [[ "$with_mpi" == ON ]] && targets+=(ring_attention)
    cmake --build "$lib" -j "$(nproc)" --target "${targets[@]}" > "$lib.build.log" 2>&1 ||
        { grep -E "error|spill" "$lib.build.log" | grep -v "error\.c" | head -20; exit 1; }
    grep -c "Building" "$lib.build.log" | sed 's/^/sources compiled: /'
    [[ -x "$lib/tests/test_cuda_ring" && -x "$lib/bench/bench_ring_cuda" ]]
}

built_library() { [[ -x "$lib/tests/test_cuda_ring" ]] || { echo "library not built: skipped"; exit 77; }; }

library_tests() {
    built_library
    have_gpu || { echo "no GPU: skipped"; exit 77; }
    local rc=0
    for run in 1 2 3; do
        for t in test_cuda_attention test_cuda_errors test_cuda_ring; do
            echo "== $t, run $run"
            RATEST_BACKEND=cuda RATEST_GPU=1 "$lib/tests/$t" 2>&1 | tail -3 || rc=1
        done
    done
    return $rc
}

# racecheck and synccheck on the backward (SPEC 10 case 8's tiny shapes run forward and
# backward), memcheck and initcheck on it and on a ring over the device-copy transport
sanitize() {
    built_library
    have_gpu || { echo "no GPU: skipped"; exit 77; }
    command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer: skipped"; exit 77; }
    local rc=0
    for tool in racecheck synccheck memcheck initcheck; do
        echo "== $tool: test_cuda_attention [fd]"
        RATEST_BACKEND=cuda RATEST_GPU=1 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            "$lib/tests/test_cuda_attention" "[fd]" 2>&1 | tail -3 || rc=1
    done
    for tool in memcheck racecheck; do
        echo "== $tool: test_cuda_ring, D_v above one tile"
        RATEST_BACKEND=cuda RATEST_GPU=1 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            "$lib/tests/test_cuda_ring" "[dims]" 2>&1 | tail -3 || rc=1
    done
    return $rc
}

ring_bench() {
    built_library
    have_gpu || { echo "no GPU: skipped"; exit 77; }
    "$lib/bench/bench_ring_cuda" --seq 16384 --heads 16 --kv-heads 16 --dim 128 --dtype bf16 \
        --mask causal --ranks 2,3,4 --layouts zigzag --reps 3
    "$lib/bench/bench_ring_cuda" --seq 4096 --heads 16 --kv-heads 16 --dim 128 --dtype f32 \
        --mask causal --ranks 2,4 --layouts contig,striped --reps 3
}

# NCCL between processes on the one GPU: NCCL takes ranks with distinct NCCL_HOSTIDs as hosts
# and joins them over its socket transport on the loopback interface
nccl_ring() {
    built_library
    have_gpu || { echo "no GPU: skipped"; exit 77; }
    local rc=0
    echo "== test_cuda_nccl [procs]"
    NCCL_SOCKET_IFNAME=lo RATEST_BACKEND=cuda RATEST_GPU=1 "$lib/tests/test_cuda_nccl" "[procs]" \
        2>&1 | grep -vE "^NCCL INFO" | tail -30 || rc=1
    if [[ -x "$lib/examples/ring_attention" ]]; then
        for n in 1 2 4; do
            echo "== mpirun -n $n ring_attention --backend cuda"
            mpirun -n "$n" --oversubscribe --allow-run-as-root -x NCCL_SOCKET_IFNAME=lo \
                bash -c 'NCCL_HOSTID=ringattn-check-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
                "$lib/examples/ring_attention" --backend cuda --seq 32768 --heads 16 \
                --kv-heads 8 --dim 128 --dtype bf16 --window 4096 2>&1 | tail -12 || rc=1
        done
    else
        echo "no mpirun on this machine: the mpirun demo is not built (skipped)"
    fi
    return $rc
}

with_mpi=OFF
command -v mpirun >/dev/null && with_mpi=ON
export root exe out lib with_mpi
export -f env_info have_gpu build_kernel run_built build_library built_library library_tests \
    sanitize ring_bench nccl_ring

stage environment 30 env.txt env_info
stage "forward tile kernel: build sm_90" 150 kernel.txt build_kernel
stage "forward tile kernel: tests (3 runs bitwise)" 40 kernel.txt run_built test
stage "forward tile kernel: TFLOP/s" 40 kernel.txt run_built bench
stage "PyTorch SDPA flash / cuDNN, forward and backward" 100 sdpa.txt python3 "$root/bench/gpu/sdpa_bench.py"
stage "library: build sm_90" 240 library.txt build_library
stage "library: CUDA tests (3 runs)" 150 library.txt library_tests
stage "library: compute-sanitizer (backward, ring)" 150 sanitizer.txt sanitize
stage "library: ring on one GPU, P = 2, 3, 4 (bench_ring_cuda)" 90 ring.txt ring_bench
stage "library: NCCL ring of processes, P = 1, 2, 4, and a rank that leaves" 120 nccl.txt nccl_ring
rm -rf "$exe" "$lib" "$lib.configure.log" "$lib.build.log"

{
    echo "# H200 check: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "| stage | status | s | file |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "## ringattn forward tile kernel"
    grep '^|' "$out/kernel.txt" 2>/dev/null || echo "(no GPU)"
    echo
    echo "## PyTorch SDPA"
    grep -E '^\||fully masked' "$out/sdpa.txt" 2>/dev/null || echo "(no torch or no GPU)"
    echo
    echo "## The library's CUDA tests"
    grep -E '^==|All tests passed|^test cases|skipped' "$out/library.txt" 2>/dev/null || echo "(not run)"
    echo
    echo "## compute-sanitizer"
    grep -E '^==|ERROR SUMMARY|skipped' "$out/sanitizer.txt" 2>/dev/null || echo "(not run)"
    echo
    echo "## bench_ring_cuda: single rank and the ring on one GPU"
    grep -E '^ *[0-9]+ |^#|skipped' "$out/ring.txt" 2>/dev/null || echo "(not run)"
    echo
    echo "## NCCL: processes on one GPU"
    grep -E '^==|All tests passed|^test cases|skipped|^forward|^backward|^ok|FAILED|rel error' \
        "$out/nccl.txt" 2>/dev/null || echo "(not run)"
} > "$out/summary.md"
cat "$out/summary.md"
