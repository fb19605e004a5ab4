"""ringattn's CPU backend against PyTorch's CPU scaled_dot_product_attention, interleaved.

    python bench/vs_torch.py [--seq 2048,4096,8192] [--kv-heads 8,2] [--mask none,causal]
                             [--dtype f32,bf16] [--threads 1,2] [--pass fwd,fwdbwd] [--reps 5]

Same shapes, threads and dtype on both sides, in one process: each repetition times ringattn
and then torch, and each side keeps its best (this machine is noisy). ringattn runs through the
Python package's numpy-level Plan (its own OpenMP threads, num_threads per plan); torch through
torch.nn.functional.scaled_dot_product_attention on [1, H, T, D] with torch.set_num_threads
(its flash kernel on CPU; GQA through enable_gqa; the window as a boolean mask). Both outputs
are compared once per row (max abs difference, a sanity check, not SPEC 9's judgement: the
tests do that). Prints one table row per case and, with --json FILE, JSON lines. Needs the
package installed (pip install ./python) or RINGATTN_LIBRARY and PYTHONPATH=python/src.
"""
import argparse
import json
import time

import numpy as np
import torch

import ringattn

DTYPES = {"f32": (torch.float32, "float32"), "bf16": (torch.bfloat16, "bfloat16"),
          "f16": (torch.float16, "float16")}
WINDOW = 1024


def as_numpy(t):
    """A torch tensor as the numpy array ringattn.Plan takes (bfloat16 as uint16 bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def best(fn, reps, budget_s=3.0):
    times, start = [], time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 2:
            break
    return min(times)


def case(T, H, Hkv, D, mask, dtype, threads, passes, reps):
    torch_dtype, name = DTYPES[dtype]
    gen = torch.Generator().manual_seed(T + H + Hkv + D)
    q = torch.randn(T, H, D, generator=gen).to(torch_dtype)
    k = torch.randn(T, Hkv, D, generator=gen).to(torch_dtype)
    v = torch.randn(T, Hkv, D, generator=gen).to(torch_dtype)
    dout = torch.randn(T, H, D, generator=gen).to(torch_dtype)
    causal = mask != "none"
    window = (WINDOW - 1, -1) if mask == "window" else None
    plan = ringattn.Plan([0, T], H, D, num_kv_heads=Hkv, dtype=name, causal=causal,
                         window=window, num_threads=threads)
    qn, kn, vn, dn = (as_numpy(x) for x in (q, k, v, dout))

    # torch: [1, H, T, D]
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
    attn_mask = None
    if mask == "window":
        i = torch.arange(T)
        attn_mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < WINDOW)
    sdpa_kw = dict(is_causal=causal and attn_mask is None, attn_mask=attn_mask,
                   enable_gqa=Hkv != H)
    rows = []
    for p in passes:
        def ring_call():
            out, lse = plan.forward(qn, kn, vn)
            if p == "fwdbwd":
                plan.backward(qn, kn, vn, out, lse, dn)

        def torch_call():
            leaves = [x.detach().requires_grad_(p == "fwdbwd") for x in (qt, kt, vt)]
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, **sdpa_kw)
            if p == "fwdbwd":
                torch.autograd.grad(out, leaves, dout.transpose(0, 1).unsqueeze(0))
            return out

        torch.set_num_threads(threads)
        ring_call(), torch_call()  # warm-up: workspaces, thread pools
        t_ring = t_torch = float("inf")
        for _ in range(reps):  # interleaved: both sides see the same moments of the machine
            t_ring = min(t_ring, best(ring_call, 1))
            t_torch = min(t_torch, best(torch_call, 1))
        out_ring, _ = plan.forward(qn, kn, vn)
        out_torch = torch_call().detach()[0].transpose(0, 1).float()
        ring_f = torch.from_numpy(out_ring.view(np.int16)).view(torch.bfloat16).float() \
            if dtype == "bf16" else torch.from_numpy(out_ring).float()
        rows.append(dict(T=T, H=H, Hkv=Hkv, D=D, mask=mask, dtype=dtype, threads=threads,
                         pass_=p, ringattn_ms=1e3 * t_ring, torch_ms=1e3 * t_torch,
                         speedup=t_torch / t_ring,
                         max_abs_diff=(ring_f - out_torch).abs().max().item()))
    plan.close()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    lst = lambda f: (lambda s: [f(x) for x in s.split(",")])  # noqa: E731
    ap.add_argument("--seq", type=lst(int), default=[2048, 4096, 8192])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=lst(int), default=[8, 2])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--mask", type=lst(str), default=["none", "causal"])
    ap.add_argument("--dtype", type=lst(str), default=["f32", "bf16"])
    ap.add_argument("--threads", type=lst(int), default=[1, 2])
    ap.add_argument("--pass", dest="passes", type=lst(str), default=["fwd", "fwdbwd"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print("# ringattn %s (%s) vs torch %s CPU SDPA; best of %d interleaved runs; window = %d" %
          (ringattn.__version__, ringattn.library_path(), torch.__version__, args.reps, WINDOW))
    print("# ringattn CPU kernels: %s; torch CPU capability: %s" %
          (ringattn.cpu_kernels(), torch.backends.cpu.get_cpu_capability()))
    print("%6s %2s %3s %4s %7s %5s %3s %7s %12s %10s %8s %9s" % (
        "T", "H", "Hkv", "D", "mask", "dtype", "thr", "pass", "ringattn_ms", "torch_ms",
        "speedup", "max_diff"))
    out = open(args.json, "w") if args.json else None
    for threads in args.threads:
        for dtype in args.dtype:
            for mask in args.mask:
                for hkv in args.kv_heads:
                    for T in args.seq:
                        for r in case(T, args.heads, hkv, args.dim, mask, dtype, threads,
                                      args.passes, args.reps):
                            print("%6d %2d %3d %4d %7s %5s %3d %7s %12.1f %10.1f %8.2f %9.1e" % (
                                r["T"], r["H"], r["Hkv"], r["D"], r["mask"], r["dtype"],
                                r["threads"], r["pass_"], r["ringattn_ms"], r["torch_ms"],
                                r["speedup"], r["max_abs_diff"]), flush=True)
                            if out:
                                out.write(json.dumps(r) + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
