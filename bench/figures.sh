#!/usr/bin/env bash
# Regenerates the figures README.md and bench/README.md show (docs/figures/*.png) on this
# machine: short runs of bench_local, bench_ring at P = 2, 3, 4, bench_dynamic, the link model's
# tables (ringattn-info --model --csv, P = 64 and 1024), then bench/plot.py with the machine and
# the date in every caption. About 6 minutes on 2 cores.
#
#   bash bench/figures.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, docs/figures)
#
# BUILD_DIR must have the benchmarks (-DRINGATTN_BUILD_BENCH=ON -DRINGATTN_ENABLE_MPI=ON) and
# ringattn-info; the Python is cmake/python-env.sh's (it has matplotlib). The JSON lines and the
# model's CSV tables are kept in OUT_DIR/data/ for bench/plot.py to redraw.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/docs/figures}"
data="$out/data"
mkdir -p "$data"
mpi=(mpirun --oversubscribe)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
python_bin="$(bash "$root/cmake/python-env.sh" | tail -n 1)"
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"
caption="$(nproc) cores of $cpu, $(date -u +%Y-%m-%d); runs of more ranks than cores share them"

"$build/bench/bench_local" --seq 1024,2048,4096,8192 --dim 128 --mask none,causal,window \
    --threads all --reps 3 --no-naive --json "$data/local.jsonl" > /dev/null
for p in 2 3 4; do # decode rows (P = 1 .. ranks) from the 2-rank run only: one per point
    decode=(--no-decode)
    [[ $p -eq 2 ]] && decode=(--decode-cache 32768,131072,524288 --decode-steps 5)
    "${mpi[@]}" -n "$p" "$build/bench/bench_ring" --seq 8192 --heads 4 --kv-heads 2 --dim 64 \
        --window-seq 8192 --window 512 --window-ranks "$p" --no-overlap --reps 2 \
        "${decode[@]}" --json "$data/ring_$p.jsonl" > /dev/null
done
"$build/bench/bench_dynamic" --seq 8192 --keep 2,4,8,16,64 --select-seqs none --reps 2 \
    --json "$data/dynamic.jsonl" > /dev/null
for p in 64 1024; do # the link model's estimate, not a run: 8 GPUs a node, T = 1M (bf16)
    "$build/ringattn-info" --seq 1048576 --heads 32 --kv-heads 8 --dim 128 --dtype bf16 --causal \
        --layout zigzag --ranks "$p" --simulate --model --csv > "$data/cp2d_p$p.csv"
done
"$python_bin" "$root/bench/plot.py" "$out" "$data"/*.jsonl "$data"/*.csv --caption "$caption"
# the P = 64 figure also beside the benchmarks (bench/README.md shows it): an estimate, no machine
"$python_bin" "$root/bench/plot.py" "$root/bench" "$data/cp2d_p64.csv" > /dev/null
