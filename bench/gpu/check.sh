#!/usr/bin/env bash
# The H200 check (DESIGN: CUDA: performance without a GPU; bench/gpu/README.md has the device command): one run within
# one deadline, its stages in the order of what they are worth:
#   1 environment       GPU, driver, nvcc, PyTorch, NCCL, cuDNN, ncu, compute-sanitizer
#   2 build             the library for sm_90 as the H200 image allows it (no OpenBLAS, OpenMP or
#                       Debian Catch2: bench/gpu/prepared/ carries the header; NCCL from the
#                       nvidia-nccl-cu13 wheel), its CUDA tests and bench_ring_cuda
#   3 correctness       test_cuda_attention, test_nan_inputs, test_cuda_errors, test_spec_cases
#                       (SPEC 10), test_dynamic_fd on the GPU against float64 (SPEC 9), outputs
#                       poisoned, two runs bitwise
#   4 speed             ringattn forward and backward against SDPA flash and cuDNN in one
#                       process (bench/gpu/speed.py), the roofline estimate beside
#   5 sanitizer         compute-sanitizer memcheck, racecheck, synccheck on forward and backward
#   6 ring              the ring on one GPU over the device-copy transport (test_cuda_ring,
#                       bench_ring_cuda P = 2, 4)
#   7 nccl              NCCL with 2 processes on the one GPU (NCCL_HOSTID per process)
#   8 ncu               one forward and one backward kernel: occupancy, bank conflicts, tensor
#                       pipe, and the emulator's counters' fields beside the emulation's own
# A stage's status is its commands' status (each runs under set -euo pipefail): ok, skipped
# (exit 77: no GPU, no tool), FAILED, or CUT (the deadline ended it, or left it no time).
# summary.md is rewritten after every stage, so a cut run still reports what it did. Seven files
# in the output folder at most: summary.md, env.txt, tests.txt, speed.txt, ring.txt, ncu.txt and
# ncu.csv.
#   bash bench/gpu/check.sh [--deadline SECONDS] [--out DIR]    default 540 s, $OUT or ./gpu-check
#   bash bench/gpu/check.sh --self-test      the stage machinery itself, here, without a GPU
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
deadline=540 out="${OUT:-$PWD/gpu-check}" self_test=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --deadline) deadline="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --self-test) self_test=1; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "check: unknown argument $1" >&2; exit 2 ;;
    esac
done
start=$SECONDS
rows=()
summary_notes=()

write_summary() {
    {
        echo "# H200 check: $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - start)) s of a ${deadline} s deadline"
        echo
        echo "| stage | status | s | log |"
        echo "|---|---|---|---|"
        printf '%s\n' "${rows[@]}"
        for n in "${summary_notes[@]}"; do echo; echo "$n"; done
    } > "$out/summary.md.tmp" && mv "$out/summary.md.tmp" "$out/summary.md"
}

# stage NAME LIMIT_S LOG FUNCTION [ARGS]: runs FUNCTION under set -euo pipefail in its own
# shell, cut at its limit or at the deadline (what is left of it, less 10 s for the summary);
# its status into the summary, rewritten now. Returns the stage's exit code.
stage() {
    local name="$1" limit="$2" log="$3"; shift 3
    local left=$((deadline - (SECONDS - start) - 10)) t0=$SECONDS rc=0 status
    [[ $left -lt $limit ]] && limit=$left
    echo "=== $name (limit ${limit} s)" >> "$out/$log"
    if [[ $left -lt 5 ]]; then
        status="CUT (no time left)" rc=124
    else
        timeout --kill-after=5 "$limit" bash -c 'set -euo pipefail; "$@"' stage "$@" \
            >> "$out/$log" 2>&1 || rc=$?
        case $rc in
            0) status=ok ;;
            77) status=skipped ;;
            124|137) status="CUT (after ${limit} s)" ;;
            *) status="FAILED (exit $rc)" ;;
        esac
    fi
    [[ $rc -eq 77 ]] && status="skipped: $(tail -n 1 "$out/$log" | cut -c1-100)"
    rows+=("| $name | $status | $((SECONDS - t0)) | $log |")
    echo "check: $name: $status ($((SECONDS - t0)) s)"
    write_summary
    return $rc
}

# ---------------------------------------------------------------- the self-test (no GPU)

self_test() {
    local dir status
    dir="$(mktemp -d)"
    # a stage whose failing command sits inside a pipeline (pipefail must reach it), one that
    # skips, one that overruns its limit, one the deadline leaves no time for
    planted_fail() { echo "step 1"; false | cat; echo "not reached"; }
    planted_skip() { echo "nothing to do here: skipped"; exit 77; }
    planted_slow() { sleep 30; }
    passes() { echo fine; }
    export -f planted_fail planted_skip planted_slow passes
    out="$dir" deadline=25 start=$SECONDS rows=()
    local seen=()
    stage "passes" 10 a.txt passes; seen+=("$(grep -c '^| ' "$dir/summary.md")")
    stage "planted failure" 10 a.txt planted_fail; seen+=("$(grep -c '^| ' "$dir/summary.md")")
    stage "planted skip" 10 a.txt planted_skip; seen+=("$(grep -c '^| ' "$dir/summary.md")")
    stage "planted overrun" 4 a.txt planted_slow; seen+=("$(grep -c '^| ' "$dir/summary.md")")
    stage "planted slow" 60 a.txt planted_slow; seen+=("$(grep -c '^| ' "$dir/summary.md")")
    stage "after the deadline" 60 a.txt passes; seen+=("$(grep -c '^| ' "$dir/summary.md")")
    cat "$dir/summary.md"
    local bad=0
    expect() { grep -qE "$1" "$dir/summary.md" || { echo "self-test: summary lacks: $1"; bad=1; }; }
    expect '^\| passes \| ok \|'
    expect '^\| planted failure \| FAILED \(exit 1\) \|'
    expect '^\| planted skip \| skipped: nothing to do here'
    expect '^\| planted overrun \| CUT \(after 4 s\) \|'
    expect '^\| planted slow \| CUT \(after [0-9]+ s\) \|'
    expect '^\| after the deadline \| CUT \(no time left\) \|'
    grep -q "not reached" "$dir/a.txt" && { echo "self-test: the failing stage went on"; bad=1; }
    # the summary after each stage held that stage's row (header row + 1, + 2, ...)
    [[ "${seen[*]}" == "2 3 4 5 6 7" ]] || { echo "self-test: summary rows after each stage: ${seen[*]}"; bad=1; }
    rm -rf "$dir"
    [[ $bad -eq 0 ]] && echo "check --self-test: ok" || echo "check --self-test: FAILED"
    return $bad
}
if [[ $self_test -eq 1 ]]; then self_test; exit $?; fi
mkdir -p "$out"

# ---------------------------------------------------------------- the stages

lib="$out/../ringattn-check-build.$$" # built outside the output folder: only the logs come back
have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
need_gpu() { have_gpu || { echo "no GPU visible: skipped"; exit 77; }; }
need_build() { [[ -x "$lib/tests/test_cuda_attention" ]] || { echo "the library was not built: skipped"; exit 77; }; }
gpu_test() { RATEST_BACKEND=cuda RATEST_GPU=1 "$lib/tests/$1" "${@:2}"; }

environment() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
    nvcc --version | tail -n 2
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())" 2>&1 || true
    for tool in ncu compute-sanitizer cuobjdump cmake ninja; do
        printf '%s: %s\n' "$tool" "$(command -v "$tool" || echo none)"
    done
    need_gpu
}

# NCCL's header and library from the nvidia-nccl-cu13 wheel (the image's), else the system's
nccl_flags() {
    python3 - <<'PY' 2>/dev/null || true
import glob, os
import nvidia.nccl
base = os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0]
libs = sorted(glob.glob(os.path.join(base, "lib", "libnccl.so*")))
if libs and os.path.exists(os.path.join(base, "include", "nccl.h")):
    print("-DRINGATTN_NCCL_INCLUDE=%s -DRINGATTN_NCCL_LIBRARY=%s" % (os.path.join(base, "include"), libs[0]))
PY
}

build() { # CHECK_DRY=1: builds without a GPU too (the dry run)
    have_gpu || [[ "${CHECK_DRY:-0}" == 1 ]] || { echo "no GPU visible: skipped"; exit 77; }
    local gen=() jobs
    jobs="$(nproc)"
    command -v ninja >/dev/null && gen=(-G Ninja)
    # shellcheck disable=SC2046 # nccl_flags is words
    cmake -S "$root" -B "$lib" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGATTN_ENABLE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DRINGATTN_ENABLE_NCCL=ON -DRINGATTN_BUILD_EMU=OFF \
        -DRINGATTN_WITH_BLAS=OFF -DRINGATTN_WITH_OPENMP=OFF -DRINGATTN_ENABLE_MPI=OFF \
        -DRINGATTN_BUILD_EXAMPLES=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON \
        -DRINGATTN_CATCH2_DIR="$root/bench/gpu/prepared" \
        $(nccl_flags) > "$lib.configure.log" 2>&1 || { tail -n 20 "$lib.configure.log"; exit 1; }
    echo "NCCL: $(nccl_flags || true) (empty: the system's)"
    [[ -f "$root/bench/gpu/prepared/catch2/catch.hpp" ]] ||
        { echo "bench/gpu/prepared/catch2/catch.hpp missing: run bench/gpu/prepare.sh here first"; exit 1; }
    # a register spill is a build error (-Xptxas --warn-on-spills,--warning-as-error)
    cmake --build "$lib" -j "$jobs" --target ringattn test_cuda_attention test_nan_inputs \
        test_cuda_errors test_spec_cases test_dynamic_fd test_cuda_ring test_cuda_nccl \
        bench_ring_cuda > "$lib.build.log" 2>&1 ||
        { grep -E "error|spill" "$lib.build.log" | head -n 20; exit 1; }
    echo "built: $(ls "$lib"/libringattn.so* | head -n 1)"
}

correctness() {
    need_build
    need_gpu
    for run in 1 2; do
        for t in test_cuda_attention test_nan_inputs test_cuda_errors test_spec_cases \
            test_dynamic_fd; do
            echo "== $t, run $run"
            gpu_test "$t" | tail -n 3
        done
    done
}

speed() {
    need_build
    need_gpu
    RINGATTN_LIBRARY="$(ls "$lib"/libringattn.so.* | head -n 1)" python3 "$root/bench/gpu/speed.py" \
        --budget "$1"
}

sanitizer() {
    need_build
    need_gpu
    command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer: skipped"; exit 77; }
    for tool in memcheck racecheck synccheck; do
        echo "== $tool: forward and backward, SPEC 10 case 8's small shapes"
        RATEST_BACKEND=cuda RATEST_GPU=1 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            "$lib/tests/test_dynamic_fd" | tail -n 4
    done
}

ring() {
    need_build
    need_gpu
    echo "== test_cuda_ring"
    gpu_test test_cuda_ring | tail -n 3
    "$lib/bench/bench_ring_cuda" --seq 16384 --heads 16 --kv-heads 16 --dim 128 --dtype bf16 \
        --mask causal --ranks 2,4 --layouts zigzag --reps 2
}

nccl() {
    need_build
    need_gpu
    echo "== test_cuda_nccl [procs]: 2 processes on one GPU, each its own NCCL_HOSTID"
    NCCL_SOCKET_IFNAME=lo gpu_test test_cuda_nccl "[procs]" | grep -vE "^NCCL INFO" | tail -n 20
}

# One forward and one backward kernel under ncu, with the emulator's counters' fields.
ncu_metrics() {
    need_build
    need_gpu
    command -v ncu >/dev/null || { echo "no ncu: skipped"; exit 77; }
    local metrics=sm__warps_active.avg.pct_of_peak_sustained_active
    metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
    metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
    metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
    metrics+=,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum
    metrics+=,smsp__inst_executed_op_ldsm.sum
    metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
    metrics+=,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
    metrics+=,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
    metrics+=,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__sass_thread_inst_executed_op_ffma_pred_on.sum
    metrics+=,gpu__time_duration.sum
    echo "== ncu: ra_fwd_tile_kernel and ra_bwd_tc_kernel at T 4096, H 16, D 128, bf16, causal"
    RINGATTN_LIBRARY="$(ls "$lib"/libringattn.so.* | head -n 1)" ncu --clock-control none \
        --kernel-name regex:"ra_fwd_tile_kernel|ra_bwd_tc_kernel" --launch-count 2 \
        --metrics "$metrics" --csv python3 "$root/bench/gpu/speed.py" --one 4096,128,causal \
        > "$out/ncu.csv"
    grep -E '"(ra_fwd|ra_bwd)' "$out/ncu.csv" | cut -d, -f5,12-14 | head -n 40
    echo "== the emulation's counters for the same kernels (recorded; bench/testdata: T 256, 512,"
    echo "   1 head: scale them by the pairs and heads of this shape to compare)"
    grep -E '"kernel": "(ra_fwd_tile_kernel|ra_bwd_tc_kernel)"' \
        "$root/bench/testdata/roofline_counters.jsonl" | head -n 4
}

export root lib out
export -f have_gpu need_gpu need_build gpu_test environment nccl_flags build correctness speed \
    sanitizer ring nccl ncu_metrics

stage environment 30 env.txt environment
stage "build: the library for sm_90 (the image's toolchain)" 200 env.txt build
stage "correctness: CUDA tests against float64, two runs" 90 tests.txt correctness
stage "speed: ringattn vs SDPA flash and cuDNN, and the estimate" 150 speed.txt speed 130
stage "compute-sanitizer: memcheck, racecheck, synccheck" 90 tests.txt sanitizer
stage "ring on one GPU: device-copy transport" 60 ring.txt ring
stage "NCCL: 2 processes on one GPU" 60 ring.txt nccl
stage "ncu: forward and backward kernel metrics" 60 ncu.txt ncu_metrics

nl=$'\n'
summary_notes+=("## correctness${nl}$(grep -E '^==|All tests passed|^test cases|FAILED|skipped' "$out/tests.txt" 2>/dev/null | head -n 30)")
summary_notes+=("## speed (TFLOP/s; estimate: bench/gpu/roofline.py, H200, not a measurement)${nl}$(grep -E '^\||fully masked' "$out/speed.txt" 2>/dev/null)")
summary_notes+=("## compute-sanitizer${nl}$(grep -E 'ERROR SUMMARY' "$out/tests.txt" 2>/dev/null)")
summary_notes+=("## ring and NCCL${nl}$(grep -hE '^==|All tests passed|^test cases|^ *[0-9]+ |skipped' "$out/ring.txt" 2>/dev/null | head -n 30)")
summary_notes+=("## ncu${nl}$(grep -vE '^===' "$out/ncu.txt" 2>/dev/null | head -n 30)")
write_summary
rm -rf "$lib" "$lib.configure.log" "$lib.build.log"
cat "$out/summary.md"
