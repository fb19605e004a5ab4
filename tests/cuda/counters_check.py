#!/usr/bin/env python3
"""The CUDA kernels' structure as the emulation counts it (issues 29, 31, 32): a kernel that
passes its tests can still be slow; this check fails where the counters show it.

It runs bench_local --backend cuda --counters on the emulated library (one head, T = 256, D 64,
128 and 256, float32 and bfloat16, no mask and causal; and the issues' shape, bfloat16, D = 128,
T = 2048, where per-tile costs are amortised as in a long sequence; that once more on an emulated
A100, RA_EMU_DEVICE=a100, whose forward has V single-buffered), reads one JSON line per kernel
launch (emu/counters.h) and checks every launch against LIMITS, printing a table.

usage: counters_check.py BENCH_LOCAL EMU_LIB_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

SEQ = 256
LONG = ("bf16", 2048)  # the issues' figures: bfloat16, D = D_v = 128, T = 2048


def smem_loads(k):
    return sum(v["requests"] for name, v in k["by_kind"].items() if name.startswith("ld.shared"))


# (kernels whose name starts with this (or each of these), which runs, what must hold, why). Each limit is a
# function of the launch's counters and the run (dtype, mask, dim, seq) giving (value, ok); the launches without
# shared memory accesses are left out of the first.
LIMITS = [
    ("ra_", lambda run: True,
     "smem wavefronts / ideal == 1",
     lambda k, run: (k["smem_wavefronts"] / max(1, k["smem_ideal_wavefronts"]),
                     k["smem_wavefronts"] == k["smem_ideal_wavefronts"]),
     "no bank conflicts anywhere: every shared access at the wavefronts its distinct words need "
     "(the SIMT backward's 32-way conflicts were issue 29's finding)"),
    (("ra_fwd_tile_kernel", "ra_bwd_tc_kernel"), lambda run: run[1] == "none",
     "mma issued / useful == 1",
     lambda k, run: (k["mma_issued"] / max(1, k["mma_useful"]), k["mma_issued"] == k["mma_useful"]),
     "without a mask no mma runs on padding or predicated off (issue 31: a run-time dtype "
     "doubled them; issue 32: the backward's 5 products once each)"),
    ("ra_fwd_tile_kernel", lambda run: run[4] == "a100",
     "A100: V single-buffered, smem <= 81 KiB",
     lambda k, run: (k["smem"] / 1024, k["kernel"].endswith(", 1>") and k["smem"] <= 81 * 1024),
     "two CTAs of 4 warps an SM in an A100's 164 KiB (issue 31): the launcher picks the "
     "single-V pipeline there"),
    ("ra_fwd_tile_kernel", lambda run: True,
     "cp.async groups in flight >= 2",
     lambda k, run: (k["max_cp_async_groups"], k["max_cp_async_groups"] >= 2),
     "K and V double-buffered: the next tile's copies land while this one computes (issue 31)"),
    ("ra_fwd_tile_kernel", lambda run: run[3] == LONG[1],
     "smem bytes read / useful mma <= 160",
     lambda k, run: (k["smem_bytes_read"] / max(1, k["mma_useful"]),
                     k["smem_bytes_read"] <= 160 * k["mma_useful"]),
     "FA2's structure: each K and V fragment feeds 2 m-tiles (128 B/mma), Q re-read from shared "
     "memory at D = 128 but for the k-step held in registers, the rows' state in registers "
     "(issue 31)"),
    ("ra_bwd_tc_kernel", lambda run: run[3] == LONG[1],
     "mma issued / useful <= 1.25",
     lambda k, run: (k["mma_issued"] / max(1, k["mma_useful"]),
                     4 * k["mma_issued"] <= 5 * k["mma_useful"]),
     "the 5 products once each, masked tiles' all-zero blocks at most a quarter more (issue 32)"),
    (("ra_bwd_keys_kernel", "ra_bwd_queries_kernel"), lambda run: run[0] == "f32" and run[2] == 128,
     "FFMA per shared load a thread >= 4",
     lambda k, run: (k["ffma"] / max(1, 32 * smem_loads(k)), k["ffma"] >= 4 * 32 * smem_loads(k)),
     "register-tiled: a shared load feeds several FMAs (issue 32: 2 loads per FMA before)"),
]


def launches(bench, lib_dir, dtype, mask, dim, seq, device):
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        env = dict(os.environ, LD_LIBRARY_PATH=lib_dir, RA_EMU_COUNTERS_FILE=out.name,
                   RA_EMU_DEVICE=device)
        cmd = [bench, "--backend", "cuda", "--seq", str(seq), "--dim", str(dim), "--heads", "1",
               "--kv-heads", "1", "--mask", mask, "--dtype", dtype, "--reps", "1", "--no-json",
               "--no-naive", "--counters"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode:
            sys.exit("counters_check: %s failed (%d):\n%s%s" % (" ".join(cmd), res.returncode,
                                                                res.stdout, res.stderr))
        return [json.loads(line) for line in out.read().splitlines() if line.strip()]


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    bench, lib_dir = argv[1], argv[2]
    failed, checked = [], set()
    runs = [(dtype, mask, dim, SEQ, "h200") for dtype in ("f32", "bf16") for mask in ("none", "causal")
            for dim in (64, 128, 256)]
    runs += [(LONG[0], mask, 128, LONG[1], "h200") for mask in ("none", "causal")]
    runs += [(LONG[0], "none", 128, LONG[1], "a100")]
    print("%-5s %-7s %4s %5s %-5s %-46s %-40s %8s" % ("dtype", "mask", "D", "T", "GPU", "kernel", "limit",
                                                      "value"))
    for run in runs:
        for k in launches(bench, lib_dir, *run):
            for prefix, applies, what, test, why in LIMITS:
                if not k["kernel"].startswith(prefix) or not applies(run):
                    continue
                if what.startswith("smem") and not k["smem_requests"]:
                    continue
                value, ok = test(k, run)
                checked.add((k["kernel"].split("<")[0], what))
                print("%-5s %-7s %4d %5d %-5s %-46s %-40s %8.3f%s" % (
                    run + (k["kernel"][:46], what, value, "" if ok else "  FAIL")))
                if not ok:
                    failed.append("%s %s: %s = %.3f (%s)" % (run, k["kernel"], what, value, why))
    # a limit that met no launch checks nothing: a renamed kernel must not pass silently
    for prefixes, _, what, _, _ in LIMITS:
        for prefix in (prefixes if isinstance(prefixes, tuple) else (prefixes,)):
            if not any(name.startswith(prefix) and w == what for name, w in checked):
                failed.append("no launch of %s met the limit '%s'" % (prefix, what))
    if failed:
        print("\nFAILED:\n  " + "\n  ".join(failed))
        return 1
    print("\nall %d limits hold" % len(LIMITS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
