#!/usr/bin/env python3
"""A roofline ESTIMATE, not a measurement, of the CUDA kernels on an H100 SXM and an H200.

It reads the emulation's counters (emu/counters.h) of one forward and one backward
call of bench_local --backend cuda on the emulated library, at two small lengths and one head,
fits each counter per mask as a * pairs(T) + b * T (pairs: the query-key pairs the mask keeps,
T: the per-row work), and extrapolates to the target lengths and heads. For each device it then
prints, separately, what each resource alone would take:

  tensor cores  mma.sync m16n8k16 issued (and useful) at the mma.sync rate -- not the wgmma peak
  shared memory wavefronts at one per clock per SM (128 bytes)
  global memory the larger of the requests' 32-byte sectors at the L2 bandwidth and the
                tensors' own bytes (each read or written once) at the HBM bandwidth
  FFMA          float32 FMAs at 128 per clock per SM
and the estimate: the largest of them divided by an occupancy factor min(1, warps per SM / 8)
from the SASS table (tests/cuda/sass_check.py). TFLOP/s count 4 D flops per kept pair and head
for the forward and 2.5 times that for the backward (FlashAttention's convention).

Calibrate against a GPU the first time one runs (bench/gpu/check.sh's speed stage): the ratio
of measured to estimated time is the model's error; record it in CALIBRATION below.

usage: roofline.py [--bench PATH] [--lib-dir DIR] [--seqs 512,1024] [--dim 128] [--heads 16]
                   [--targets 8192,16384] [--save FILE.jsonl] [--from FILE.jsonl]
  --bench, --lib-dir: bench_local and the emulated libringattn (default: build/bench,
  build/emu); --save writes the counters it collected, --from reads such a file instead
  of running the emulation (bench/testdata/roofline_counters.jsonl: CI's run of this script).
"""
import json
import os
import subprocess
import sys
import tempfile

# The devices (vendor datasheets unless said; SMs and the clock as nvidia-smi read them on an
# H200 here, the clocks under load). Every rate is per device.
SMS = 132
CLOCK = 1.98e9  # Hz, SM clock under a matrix load (nvidia-smi on the H200, KINDS.md)
# wgmma's dense bf16 peak is 4096 flop per clock per SM (990 TFLOP/s at 1.83 GHz, datasheet);
# mma.sync, the instruction these kernels issue, reaches about half of it on Hopper
# (microbenchmarks: arXiv 2402.13499, 2501.12084). ASSUMED until a GPU measures it.
MMA_SYNC_FLOPS = 0.5 * 4096 * SMS * CLOCK
SMEM_WAVEFRONTS_PER_S = SMS * CLOCK  # one 128-byte wavefront per clock per SM
FFMA_PER_S = 128 * SMS * CLOCK       # 128 float32 lanes per SM (67 TFLOP/s, datasheet)
# L2: ASSUMED 7 TB/s on either (microbenchmarks put Hopper's L2 read bandwidth near there;
# K and V of one head, a few MiB, stay in its 50-60 MB while the query tiles re-read them)
DEVICES = {
    "H100 SXM": dict(hbm=3.35e12, l2=7e12),  # HBM: datasheet
    "H200": dict(hbm=4.3e12, l2=7e12),       # HBM: measured here (a device copy, KINDS.md); datasheet 4.8
}
# warps per SM of each kernel on sm_90 (tests/cuda/sass_check.py's table, D = 128)
WARPS_PER_SM = {"ra_fwd_tile_kernel": 8, "ra_fwd_f32_kernel": 8, "ra_bwd_keys_kernel": 8,
                "ra_bwd_queries_kernel": 8, "ra_bwd_tc_kernel": 8, "ra_bwd_stats_kernel": 8,
                "ra_bwd_prologue_kernel": 64, "ra_bwd_dq_sum_kernel": 64}
# measured / estimated time, per (device, pass), once a GPU has run the speed stage
CALIBRATION = {}

COUNTERS = ("mma_issued", "mma_useful", "smem_wavefronts", "gmem_sectors", "ffma")


def pairs(mask, T):
    return T * T if mask == "none" else T * (T + 1) // 2


def collect(bench, lib_dir, seqs, dim):
    records = []
    for mask in ("none", "causal"):
        for T in seqs:
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
                env = dict(os.environ, LD_LIBRARY_PATH=lib_dir, RA_EMU_COUNTERS_FILE=out.name)
                cmd = [bench, "--backend", "cuda", "--seq", str(T), "--dim", str(dim), "--heads",
                       "1", "--kv-heads", "1", "--mask", mask, "--dtype", "bf16", "--reps", "1",
                       "--no-json", "--no-naive", "--counters"]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if r.returncode:
                    sys.exit("roofline: %s failed: %s" % (" ".join(cmd), r.stderr[-400:]))
                for line in open(out.name):
                    c = json.loads(line)
                    name = c["kernel"].split("<")[0]
                    if not name.startswith(("ra_fwd", "ra_bwd")):
                        continue  # the element kernels: a few percent of either pass
                    records.append(dict(mask=mask, seq=T, dim=dim, kernel=name,
                                        **{k: c[k] for k in COUNTERS}))
    return records


def fit(records, mask, kernel, seqs):
    """Each counter of kernel as a * pairs(T) + b * T from the two smallest lengths."""
    t1, t2 = seqs[0], seqs[-1]
    at = {T: [r for r in records if r["mask"] == mask and r["kernel"] == kernel and r["seq"] == T]
          for T in (t1, t2)}
    if not at[t1] or not at[t2]:
        return None
    coef = {}
    p1, p2 = pairs(mask, t1), pairs(mask, t2)
    det = p1 * t2 - p2 * t1
    for k in COUNTERS:
        c1, c2 = sum(r[k] for r in at[t1]), sum(r[k] for r in at[t2])
        a = (c1 * t2 - c2 * t1) / det
        b = (p1 * c2 - p2 * c1) / det
        coef[k] = (a, b)
    return coef


def times(counts, dev, warps, tensor_bytes):
    occ = min(1.0, warps / 8.0)
    t = dict(tensor=counts["mma_issued"] * 4096 / MMA_SYNC_FLOPS,
             tensor_useful=counts["mma_useful"] * 4096 / MMA_SYNC_FLOPS,
             smem=counts["smem_wavefronts"] / SMEM_WAVEFRONTS_PER_S,
             gmem=max(counts["gmem_sectors"] * 32 / dev["l2"], tensor_bytes / dev["hbm"]),
             ffma=counts["ffma"] / FFMA_PER_S)
    t["estimate"] = max(t["tensor"], t["smem"], t["gmem"], t["ffma"]) / occ
    return t


def main(argv):
    opt = dict(bench="build/bench/bench_local", lib="build/emu", seqs="512,1024", dim="128",
               heads="16", targets="8192,16384", save=None, src=None)
    keys = {"--bench": "bench", "--lib-dir": "lib", "--seqs": "seqs", "--dim": "dim",
            "--heads": "heads", "--targets": "targets", "--save": "save", "--from": "src"}
    i = 1
    while i < len(argv):
        if argv[i] in ("-h", "--help"):
            print(__doc__)
            return 0
        if argv[i] not in keys or i + 1 >= len(argv):
            sys.exit("roofline: unknown or incomplete argument %s (see --help)" % argv[i])
        opt[keys[argv[i]]] = argv[i + 1]
        i += 2
    seqs = [int(s) for s in opt["seqs"].split(",")]
    dim, heads = int(opt["dim"]), int(opt["heads"])
    if opt["src"]:
        records = [json.loads(line) for line in open(opt["src"]) if line.strip()]
        seqs = sorted({r["seq"] for r in records})
        dim = records[0]["dim"]
    else:
        records = collect(opt["bench"], opt["lib"], seqs, dim)
    if opt["save"]:
        with open(opt["save"], "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    print("ESTIMATE, not a measurement: counters of the emulation at T %s, 1 head, D %d, bf16,"
          " extrapolated to %d heads; mma.sync at %.0f TFLOP/s (assumed: half of wgmma's dense"
          " peak), shared memory %.1f TB/s, FFMA %.1f TFLOP/s" % (
              ",".join(map(str, seqs)), dim, heads, MMA_SYNC_FLOPS / 1e12,
              SMEM_WAVEFRONTS_PER_S * 128 / 1e12, 2 * FFMA_PER_S / 1e12))
    print("%-9s %-7s %6s %-4s %9s %9s %9s %9s %9s %10s %9s" % (
        "device", "mask", "T", "pass", "tensor", "(useful)", "smem", "gmem", "ffma", "estimate",
        "TFLOP/s"))
    kernels = sorted({r["kernel"] for r in records})
    for device, dev in DEVICES.items():
        for mask in ("none", "causal"):
            for T in [int(t) for t in opt["targets"].split(",")]:
                for pass_name, prefix in (("fwd", "ra_fwd"), ("bwd", "ra_bwd")):
                    total = dict.fromkeys(("tensor", "tensor_useful", "smem", "gmem", "ffma",
                                           "estimate"), 0.0)
                    for kernel in kernels:
                        if not kernel.startswith(prefix):
                            continue
                        coef = fit(records, mask, kernel, seqs)
                        if not coef:
                            continue
                        counts = {k: heads * max(0.0, a * pairs(mask, T) + b * T)
                                  for k, (a, b) in coef.items()}
                        # each kernel's tensors once (bf16; float32 LSE and sums ignored): the
                        # forward Q, K, V, O; the backward's key and query passes those and dO
                        # with their own gradients
                        tensor_bytes = 2 * T * heads * dim * (4 if pass_name == "fwd" else 3)
                        t = times(counts, dev, WARPS_PER_SM.get(kernel, 8), tensor_bytes)
                        for k in total:
                            total[k] += t[k]  # the kernels of a pass run one after another
                    flops = 4.0 * dim * pairs(mask, T) * heads * (2.5 if pass_name == "bwd" else 1.0)
                    cal = CALIBRATION.get((device, pass_name))
                    est = total["estimate"] * (cal or 1.0)
                    print("%-9s %-7s %6d %-4s %8.2fms %8.2fms %8.2fms %8.2fms %8.2fms %9.2fms %9.1f%s" % (
                        device, mask, T, pass_name, 1e3 * total["tensor"],
                        1e3 * total["tensor_useful"], 1e3 * total["smem"], 1e3 * total["gmem"],
                        1e3 * total["ffma"], 1e3 * est, flops / est / 1e12 if est else 0.0,
                        " (calibrated)" if cal else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
