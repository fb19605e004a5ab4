#!/usr/bin/env bash
# The H200 check (CUDA.md section 4), for what exists so far: the forward tile kernel driven
# directly (bench/gpu/fwd_tile_gpu.cu: needs only nvcc), then the library's own CUDA tests
# (test_cuda_attention, test_cuda_errors: SPEC 9 against float64, three runs) where the machine
# can build the library (OpenBLAS and Catch2; else that stage is skipped with the reason). One
# run of at most about 6 minutes; each stage under its own timeout; at most 8 files in the
# output folder (default $OUT, else ./gpu-check): env.txt build.txt test.txt sanitizer.txt
# bench.txt sdpa.txt library.txt summary.md. Without a GPU every GPU stage ends cleanly as
# "skipped" (the dry run).
#   bash bench/gpu/check.sh [OUTDIR]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-${OUT:-$PWD/gpu-check}}"
mkdir -p "$out"
exe="$out/../fwd_tile_gpu.$$" # built outside the output folder: only the 7 files come back
rows=()

# stage NAME LIMIT_S FILE COMMAND...: runs it, records status (ok / skipped / FAILED) and time
stage() {
    local name="$1" limit="$2" file="$3"; shift 3
    local t0=$SECONDS rc=0
    timeout "$limit" bash -c '"$@"' stage "$@" > "$out/$file" 2>&1 || rc=$?
    local status=ok
    [[ $rc -eq 77 ]] && status=skipped
    [[ $rc -eq 124 ]] && status="FAILED (timeout ${limit}s)"
    [[ $rc -ne 0 && $rc -ne 77 && $rc -ne 124 ]] && status="FAILED (rc $rc)"
    rows+=("| $name | $status | $((SECONDS - t0)) | $file |")
    echo "check: $name: $status ($((SECONDS - t0)) s)"
    return $rc
}

env_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
    nvcc --version | tail -2
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())" 2>&1 || true
    command -v nvidia-smi >/dev/null || exit 77
}

build() {
    nvcc -std=c++17 -O3 -arch=sm_90 -I"$root" -I"$root/include" -Xptxas -v \
         "$root/bench/gpu/fwd_tile_gpu.cu" -o "$exe" 2>&1 | grep -E "error|Compiling|registers|spill"
    [[ -x "$exe" ]]
}

sanitize() {
    command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer: skipped"; exit 77; }
    [[ -x "$exe" ]] || { echo "not built: skipped"; exit 77; }
    "$exe" test > /dev/null; [[ $? -eq 77 ]] && { echo "no GPU: skipped"; exit 77; }
    local rc=0
    for tool in memcheck racecheck synccheck initcheck; do
        echo "== $tool"
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$exe" test 2>&1 | tail -4 || rc=1
    done
    return $rc
}

# The library built with the CUDA backend for sm_90, and its GPU tests three times.
library() {
    set -o pipefail
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
    local b="$out/../ringattn-build.$$"
    cmake -S "$root" -B "$b" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_ENABLE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DRINGATTN_BUILD_EMU=OFF -DRINGATTN_BUILD_BENCH=OFF \
        -DRINGATTN_BUILD_EXAMPLES=OFF > "$b.configure.log" 2>&1 ||
        { echo "configure failed (OpenBLAS or Catch2 missing?): skipped"; tail -3 "$b.configure.log"; exit 77; }
    cmake --build "$b" -j "$(nproc)" --target test_cuda_attention test_cuda_errors 2>&1 | grep -E "error|spill" && exit 1
    local rc=0
    for run in 1 2 3; do
        for t in test_cuda_attention test_cuda_errors; do
            echo "== $t, run $run"
            RATEST_BACKEND=cuda RATEST_GPU=1 "$b/tests/$t" 2>&1 | tail -3 || rc=1
        done
    done
    rm -rf "$b" "$b.configure.log"
    return $rc
}

export root exe out
export -f env_info build sanitize library
run_built() { [[ -x "$exe" ]] || { echo "not built: skipped"; exit 77; }; "$exe" "$@"; }
export -f run_built

stage environment 30 env.txt env_info
stage "build sm_90" 180 build.txt build
stage "kernel tests on the GPU (3 runs bitwise)" 60 test.txt run_built test
stage compute-sanitizer 150 sanitizer.txt sanitize
stage "forward TFLOP/s" 60 bench.txt run_built bench
stage "PyTorch SDPA flash / cuDNN" 90 sdpa.txt python3 "$root/bench/gpu/sdpa_bench.py"
stage "library CUDA tests on the GPU (3 runs)" 240 library.txt library
rm -f "$exe"

{
    echo "# H200 check: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "| stage | status | s | file |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "## ringattn forward tile kernel"
    grep '^|' "$out/bench.txt" 2>/dev/null || echo "(no GPU)"
    echo
    echo "## PyTorch SDPA"
    grep -E '^\||fully masked' "$out/sdpa.txt" 2>/dev/null || echo "(no torch or no GPU)"
    echo
    echo "## The library's CUDA tests"
    grep -E '^==|All tests passed|^test cases|skipped' "$out/library.txt" 2>/dev/null || echo "(not run)"
} > "$out/summary.md"
cat "$out/summary.md"
