#!/usr/bin/env python3
"""test_cuda_sass: the SASS of every kernel instantiation of a CUDA build, for sm_80 and sm_90.

Reads the library's fatbins with cuobjdump (-res-usage, -sass; nvdisasm beside it), prints one
table per architecture -- registers, spill stores and loads (STL/LDL), local memory, static
shared memory, the dynamic shared memory the launcher asks for, CTAs and warps per SM by the
occupancy rules of the architecture, HMMA instructions and how many are predicated or of a
second dtype, MUFU.EX2 and the precise expf range reductions (FFMA.RM) -- and checks the limits
of LIMITS below. A limit a kernel is known to miss today is listed in KNOWN with the issue that
removes it: it is reported, not failed; if it holds, the check fails so that KNOWN stays true.

usage: sass_check.py LIBRARY [--cuobjdump PATH]     exit 0 pass, 1 fail, 77 skipped (no tool)
cuobjdump (and nvdisasm beside it) from --cuobjdump, $RINGATTN_CUOBJDUMP, PATH, the Python tests'
virtual environment ($RINGATTN_VENV, default ~/.cache/ringattn/venv: the nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm wheels of python/requirements-test.txt) or nvcc's folder.
"""
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

# The limits, each with why. A kernel matches a row by the start of its (demangled) name, or by
# the row's pattern where it has a "*".
LIMITS = [
    # a spill turns registers into local memory traffic: the build already fails on one
    # (-Xptxas --warn-on-spills --warning-as-error); this says where, from the SASS
    ("*", "spill_insns", 0, "STL/LDL in the SASS: registers spilled to local memory"),
    ("*", "local_bytes", 0, "a local-memory stack frame: spills or arrays indexed at run time"),
    # the dtype and the features are the kernel's template, never a run-time branch: a kernel
    # that holds the HMMA of both 16-bit dtypes issues half of them predicated off (issue 31)
    ("ra_fwd_tile_kernel", "hmma_second_dtype", 0, "HMMA of a second dtype: dtype chosen at run time"),
    ("ra_fwd_tile_kernel", "hmma_predicated", 0, "predicated HMMA: tensor work issued and discarded"),
    # FA2's structure keeps at least two CTAs of 4 warps, or 8 warps, resident per SM
    ("ra_fwd_tile_kernel", "min_warps_per_sm", 8, "warps per SM: latency hiding needs two CTAs"),
    ("ra_fwd_f32_kernel", "min_warps_per_sm", 8, "warps per SM: latency hiding needs two CTAs"),
    ("ra_bwd_keys_kernel", "min_warps_per_sm", 8, "warps per SM: latency hiding needs two CTAs"),
    ("ra_bwd_queries_kernel", "min_warps_per_sm", 8, "warps per SM: latency hiding needs two CTAs"),
    ("ra_bwd_tc_kernel", "min_warps_per_sm", 8, "warps per SM: latency hiding needs two CTAs"),
    # the tensor-core backward's two-block kernel (issue 32: >= 2 CTAs at D = 128) at 128
    # registers without a spill (names: <dtype, D, D_v, features, Q buffers, blocks an SM>)
    ("ra_bwd_tc_kernel<*, 2>", "min_ctas_per_sm", 2, "two blocks of 8 warps an SM"),
]

# Kernels a launcher never runs on an architecture: their occupancy there is not theirs to meet.
# The tile kernel with V double-buffered at D = D_v = 128 (96 KiB: one CTA in an A100's 164 KiB)
# gives way there to its single-V instantiation (80 KiB, two CTAs): forward_tile.cu chooses by
# the device's shared memory per SM (H100/H200's 228 KiB hold two of either).
NOT_LAUNCHED = {
    ("ra_fwd_tile_kernel<%s, 128, 128, false, 2>" % b, "sm_80"):
        "an A100 runs ra_fwd_tile_kernel<%s, 128, 128, false, 1> (forward_tile.cu)" % b
    for b in ("true", "false")}

# Limits today's kernels are known to miss, by (kernel name prefix, fact, architecture), and
# the issue that removes each.
KNOWN = {
    ("ra_fwd_f32_kernel<256", "min_warps_per_sm", "sm_80"):
        "later: the float32 kernel's Q tile at D = 256 (64 x 260 floats) leaves one CTA on sm_80",
    ("ra_bwd_keys_kernel", "min_warps_per_sm", "sm_80"):
        "later: the float32 backward's SIMT tiles take 108 KiB at D = 128, 100 KiB at D = 256: one "
        "CTA in an A100's 164 KiB (bf16 and f16 run the tensor-core backward)",
    ("ra_bwd_queries_kernel", "min_warps_per_sm", "sm_80"):
        "later: the float32 backward's SIMT tiles take 108 KiB at D = 128, 100 KiB at D = 256: one "
        "CTA in an A100's 164 KiB (bf16 and f16 run the tensor-core backward)",
}

# Each architecture's SM (CUDA occupancy rules): registers, threads, CTAs, shared memory per SM
# and the most one CTA may take, the register allocation unit (per warp) and the shared memory
# the runtime reserves per CTA.
ARCH = {
    "sm_80": dict(regs=65536, threads=2048, ctas=32, smem=167936, reserved=1024, unit=256),
    "sm_90": dict(regs=65536, threads=2048, ctas=32, smem=233472, reserved=1024, unit=256),
}


def tile_keys(d):  # kernels/cuda/forward_common.cuh: ra__cuda_keys_per_tile
    return 32 if d >= 256 else 64


def tile_queries(d, full):  # kernels/cuda/forward_common.cuh: ra__cuda_query_tile
    return 64 if d >= 256 or full else 128


def bwd_tile(d, dv):  # kernels/cuda/backward_common.cuh: ra__cuda_bwd_tile
    return 32 if d + dv <= 256 else 16


def bwd_tc_smem(d, dv, full, qbuf):
    """backward_tc_warp.cuh's layout at the default precision: K, V, Q and dO qbuf times, P, dZ,
    the rows (the feature kernel's: sizeof(ra_bwd::brow) = 72, and a float a key), the block's
    place (48 bytes)"""
    return (64 * (d + dv) + qbuf * 64 * (d + dv) + 2 * 64 * 64) * 2 + \
        (2 * 64 * 72 + 64 * 4 if full else 2 * 64 * 16) + 48


# The tensor-core backward with Q and dO double-buffered where the architecture's block holds
# it, else single-buffered (backward_tc.cu: an A100 at D or D_v = 256).
for _arch, _block in (("sm_80", 163 * 1024), ("sm_90", 227 * 1024)):
    for _b in ("true", "false"):
        for _d, _dv in ((128, 256), (256, 128), (256, 256)):
            for _f in ("true", "false"):
                if bwd_tc_smem(_d, _dv, _f == "true", 2) > _block:
                    _name = "ra_bwd_tc_kernel<%s, %d, %d, %s, %%d, 1>" % (_b, _d, _dv, _f)
                    NOT_LAUNCHED[(_name % 2, _arch)] = "%s KiB a block: backward_tc.cu runs %s" % (
                        _block // 1024, _name % 1)
# ... and its two-block kernel (plain, head dims up to 128) where two fit an SM: on an A100 not
# at D = D_v = 128 (84 KiB), which runs one block with Q and dO double-buffered there.
for _b in ("true", "false"):
    NOT_LAUNCHED[("ra_bwd_tc_kernel<%s, 128, 128, false, 1, 2>" % _b, "sm_80")] = (
        "two blocks exceed an A100's 164 KiB: backward_tc.cu runs "
        "ra_bwd_tc_kernel<%s, 128, 128, false, 2, 1>" % _b)


# What each launcher asks for (threads, dynamic shared memory), from its template arguments or,
# for the backward (head dims at run time), at D = D_v = 128.
def launch_shape(name):
    m = re.match(r"ra_fwd_tile_kernel<\w+, (\d+), (\d+), (\w+), (\d)>", name)
    if m:  # Q, K double-buffered, V VBUF times (forward_tile.cuh: ra_fwd_tile_smem)
        d, dv, full, vbuf = int(m.group(1)), int(m.group(2)), m.group(3) == "true", int(m.group(4))
        bq = tile_queries(d, full)
        return 128, (bq * d + tile_keys(d) * (2 * d + vbuf * dv)) * 2, ""
    m = re.match(r"ra_fwd_f32_kernel<(\d+), (\d+)>", name)
    if m:
        d, dv = int(m.group(1)), int(m.group(2))
        return 128, (64 * (d + 4) + 16 * (d + dv)) * 4, ""
    m = re.match(r"ra_bwd_tc_kernel<\w+, (\d+), (\d+), (\w+), (\d), \d>", name)
    if m:
        return 256, bwd_tc_smem(int(m.group(1)), int(m.group(2)), m.group(3) == "true", int(m.group(4))), ""
    if name.startswith("ra_bwd_prologue"):
        return 256, 0, ""
    m = re.match(r"ra_bwd_\w+<(\d+)>", name)
    if m:  # the tile a template (backward_common.cuh: ra__cuda_bwd_smem), head dims at run time
        t, d = int(m.group(1)), 128 if int(m.group(1)) == bwd_tile(128, 128) else 256
        lp = 24 if t == 16 else t + 4  # ra__cuda_bwd_pair_ld of the key pass, the larger
        return 128, (2 * t * (d + 4 + d + 4) + t * 2 * d + 2 * t * lp + 4 + 8 * t + t) * 4, \
            " (D %d)" % d
    return 256, 0, ""  # the element kernels (memory.cu, merge.cu): RA_CUDA_THREADS


def occupancy(arch, regs, threads, smem):
    a = ARCH[arch]
    warps = (threads + 31) // 32
    per_warp = -(-regs * 32 // a["unit"]) * a["unit"]
    by_regs = a["regs"] // (per_warp * warps) if regs else a["ctas"]
    by_smem = a["smem"] // (smem + a["reserved"]) if smem else a["ctas"]
    ctas = min(by_regs, by_smem, a["threads"] // threads, a["ctas"])
    return ctas, ctas * warps


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def short(name):
    """ "void ra_fwd_tile_kernel<128, 128>(ra_attn_args)" -> "ra_fwd_tile_kernel<128, 128>" """
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"^void ", "", name)
    depth, out = 0, ""
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out += ch
    return out


def find_cuobjdump(argv):
    if "--cuobjdump" in argv:
        return argv[argv.index("--cuobjdump") + 1]
    places = [os.environ.get("RINGATTN_CUOBJDUMP"), shutil.which("cuobjdump")]
    venv = os.environ.get("RINGATTN_VENV", os.path.expanduser("~/.cache/ringattn/venv"))
    lib = os.path.join(venv, "lib")
    if os.path.isdir(lib):
        for py in sorted(os.listdir(lib)):
            places.append(os.path.join(lib, py, "site-packages/nvidia/cu13/bin/cuobjdump"))
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    places.append(os.path.join(os.path.dirname(nvcc), "cuobjdump"))
    for p in places:
        if p and os.path.exists(p) and os.path.exists(os.path.join(os.path.dirname(p), "nvdisasm")):
            return p
    return None


def run(tool, *args):
    return subprocess.run([tool, *args], capture_output=True, text=True)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    lib = argv[1]
    tool = find_cuobjdump(argv)
    if not tool or not os.path.exists(tool):
        print("test_cuda_sass: no cuobjdump with nvdisasm beside it (pip install "
              "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or the CUDA toolkit's): skipped")
        return 77
    env_path = os.path.dirname(os.path.realpath(tool))  # nvdisasm beside it
    os.environ["PATH"] = env_path + os.pathsep + os.environ.get("PATH", "")
    usage = run(tool, "-res-usage", lib)
    sass = run(tool, "-sass", lib)
    if usage.returncode or sass.returncode:
        print("test_cuda_sass: cuobjdump failed:", (usage.stderr + sass.stderr).strip()[:400])
        return 1

    kernels = {}  # (arch, mangled) -> facts
    arch = None
    fn = None
    for line in usage.stdout.splitlines():
        m = re.match(r"arch = (sm_\d+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            fn = m.group(1)
        m = re.match(r"\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and fn and arch in ARCH:
            kernels[(arch, fn)] = dict(regs=int(m.group(1)), stack=int(m.group(2)),
                                       static_smem=int(m.group(3)), local=int(m.group(4)))
    counts = defaultdict(lambda: defaultdict(int))
    arch = fn = None
    for line in sass.stdout.splitlines():
        m = re.search(r"code for (sm_\d+)", line)
        if m:
            arch = m.group(1)
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn = m.group(1)
        if not fn or arch not in ARCH:
            continue
        c = counts[(arch, fn)]
        insn = re.search(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not insn:
            continue
        pred, op = insn.group(1), insn.group(2)
        if op.startswith("HMMA"):
            c["hmma"] += 1
            c["hmma_predicated"] += pred is not None
            c["hmma_bf16" if ".BF16" in op else "hmma_f16" if "F32" in op else "hmma_other"] += 1
        elif op.startswith(("STL", "LDL")):
            c["spill_insns"] += 1
        elif op == "MUFU.EX2":
            c["mufu_ex2"] += 1
        elif op.startswith("MUFU"):
            c["mufu_other"] += 1
        elif op.startswith("FFMA.RM"):
            c["expf_reductions"] += 1
    names = demangle(sorted({fn for _, fn in kernels}))

    failed = []
    for arch_name in sorted(ARCH):
        rows = sorted((short(names[fn]), fn) for a, fn in kernels if a == arch_name)
        if not rows:
            continue
        print("\n%s (limits: registers %d, shared memory per SM %d bytes)" % (
            arch_name, ARCH[arch_name]["regs"], ARCH[arch_name]["smem"]))
        head = ("kernel", "regs", "spills", "local", "smem_s", "smem_dyn", "ctas/SM", "warps/SM",
                "HMMA", "pred", "2nd-dt", "EX2", "MUFU", "expf.RM")
        print("%-44s %5s %6s %5s %6s %8s %7s %8s %5s %5s %6s %4s %4s %7s" % head)
        for name, fn in rows:
            k, c = kernels[(arch_name, fn)], counts[(arch_name, fn)]
            threads, dyn, note = launch_shape(name)
            ctas, warps = occupancy(arch_name, k["regs"], threads, dyn + k["static_smem"])
            second = min(c["hmma_bf16"], c["hmma_f16"])
            facts = dict(spill_insns=c["spill_insns"], local_bytes=k["local"] + k["stack"],
                         hmma_second_dtype=second, hmma_predicated=c["hmma_predicated"],
                         min_warps_per_sm=warps, min_ctas_per_sm=ctas)
            print("%-44s %5d %6d %5d %6d %8s %7d %8d %5d %5d %6d %4d %4d %7d" % (
                (name + note)[:44], k["regs"], c["spill_insns"], k["local"] + k["stack"],
                k["static_smem"], dyn, ctas, warps, c["hmma"], c["hmma_predicated"], second,
                c["mufu_ex2"], c["mufu_other"], c["expf_reductions"]))
            for prefix, what, limit, why in LIMITS:
                if not fnmatch.fnmatchcase(name, prefix if "*" in prefix else prefix + "*"):
                    continue
                value = facts[what]
                skip = NOT_LAUNCHED.get((name, arch_name)) if what.startswith("min_") else None
                if skip:
                    print("  not launched on %s: %s (%s = %d); %s" % (arch_name, name, what, value, skip))
                    continue
                ok = value >= limit if what.startswith("min_") else value <= limit
                known = next((why_known for (p, w, a), why_known in KNOWN.items()
                              if name.startswith(p) and w == what and a in (arch_name, "*")), None)
                where = "%s %s: %s = %d (limit %s%d: %s)" % (
                    arch_name, name, what, value, ">= " if what.startswith("min_") else "<= ",
                    limit, why)
                if known and ok:
                    failed.append(where + " -- holds now: remove it from KNOWN (" + known + ")")
                elif known:
                    print("  known: %s; %s" % (where, known))
                elif not ok:
                    failed.append(where)
    if not kernels:
        failed.append("no sm_80/sm_90 kernels found in " + lib)
    for f in failed:
        print("test_cuda_sass: FAILED: " + f)
    print("\ntest_cuda_sass: %s (%d kernels)" % ("failed" if failed else "ok", len(kernels)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
