"""The H200 check's speed stage (bench/gpu/check.sh): ringattn's CUDA backend (the Python package
over the library RINGATTN_LIBRARY names) against PyTorch SDPA's flash and cuDNN backends, in one
process on the same shapes: forward and backward TFLOP/s, bf16, H = 16, T in 4096, 8192, 16384,
D in 64, 128, full and causal, random inputs; the ratios, and the roofline estimate
(bench/gpu/roofline.py on the recorded counters) beside ringattn's. Then what each backend
returns for a fully masked row, and the tensor-core backward with two blocks an SM against one
(RINGATTN_CUDA_BWD_BLOCKS=1) at D = 128.

  python3 bench/gpu/speed.py [--budget SECONDS] [--one T,D,causal]

Each measurement: a warm-up, then the best of up to 5 CUDA-event timings within its share of
--budget (default 200 s), at least one. --one runs one forward and one backward of ringattn at
that shape and nothing else (for ncu). Prints markdown; exits 77 without torch or a GPU.
"""
import os
import subprocess
import sys
import time

try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
except Exception as e:  # noqa: BLE001 - any import failure means: nothing to compare with
    print(f"speed: no torch ({e}): skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("speed: no CUDA device visible: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "src"))
F = torch.nn.functional
H = 16


def args():
    budget, one = 200.0, None
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--budget":
            budget = float(argv[i + 1])
        if a == "--one":
            t, d, c = argv[i + 1].split(",")
            one = (int(t), int(d), c in ("1", "causal", "true"))
    return budget, one


def best_ms(fn, share):
    """A warm-up, then the best of up to 5 timings while the share of the budget lasts."""
    fn()
    torch.cuda.synchronize()
    best, start = float("inf"), time.time()
    for _ in range(5):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b))
        if time.time() - start > share:
            break
    return best


def ringattn_calls(T, D, causal):
    import ringattn.torch as rt
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, T], dtype=torch.int32)
    fwd = lambda: rt.attention(q, k, v, cu, causal=causal)  # noqa: E731
    out, _ = fwd()
    bwd = lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)  # noqa: E731
    return fwd, bwd


def sdpa_calls(backend, T, D, causal):
    q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)

    def fwd():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    out = fwd()

    def bwd():
        with sdpa_kernel(backend):
            return torch.autograd.grad(out, (q, k, v), g, retain_graph=True)

    return fwd, bwd


def estimates():
    """roofline.py's ESTIMATEs (H200 rows) by (mask, T, pass), in ms; {} when it cannot run."""
    data = os.path.join(HERE, "..", "testdata", "roofline_counters.jsonl")
    r = subprocess.run([sys.executable, os.path.join(HERE, "roofline.py"), "--from", data,
                        "--targets", "4096,8192,16384"], capture_output=True, text=True)
    est = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) > 9 and parts[0] == "H200":
            est[(parts[1], int(parts[2]), parts[3])] = float(parts[9].rstrip("ms"))
    return est


def main():
    budget, one = args()
    if one:
        fwd, bwd = ringattn_calls(*one)
        fwd()
        bwd()
        torch.cuda.synchronize()
        print("speed: one ringattn forward and backward at T %d, D %d, %s" % (
            one[0], one[1], "causal" if one[2] else "full"))
        return 0
    shapes = [(T, D, c) for T in (4096, 8192, 16384) for D in (64, 128) for c in (False, True)]
    share = budget / (len(shapes) * 6)  # 3 implementations x 2 passes
    est = estimates()
    print("| T | D | mask | pass | ringattn TFLOP/s | estimate | flash | cudnn | vs flash | vs cudnn |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for T, D, causal in shapes:
        mask = "causal" if causal else "none"
        flop = 4.0 * D * H * (T * (T + 1) / 2 if causal else T * T)  # FlashAttention's count
        rows = {}
        for name, make in (("ringattn", lambda: ringattn_calls(T, D, causal)),
                           ("flash", lambda: sdpa_calls(SDPBackend.FLASH_ATTENTION, T, D, causal)),
                           ("cudnn", lambda: sdpa_calls(SDPBackend.CUDNN_ATTENTION, T, D, causal))):
            try:
                fwd, bwd = make()
                rows[name] = (best_ms(fwd, share), best_ms(bwd, share))
            except RuntimeError as e:
                print(f"<!-- {name} T {T} D {D} {mask}: {str(e).splitlines()[0][:100]} -->")
            torch.cuda.empty_cache()
        for i, pas in enumerate(("fwd", "bwd")):
            f = flop * (2.5 if pas == "bwd" else 1.0)
            tf = {n: f / (ms[i] * 1e-3) / 1e12 for n, ms in rows.items()}
            e = est.get((mask, T, pas))
            cell = lambda n: "%.1f" % tf[n] if n in tf else "-"  # noqa: E731
            ratio = lambda n: ("%.2f" % (tf["ringattn"] / tf[n]) if "ringattn" in tf and n in tf  # noqa: E731
                               else "-")
            print("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                T, D, mask, pas, cell("ringattn"),
                "%.1f (%.1f ms)" % (f / (e * 1e-3) / 1e12, e) if e and D == 128 else "-",
                cell("flash"), cell("cudnn"), ratio("flash"), ratio("cudnn")))
        sys.stdout.flush()
    # the tensor-core backward's two kernels at D = 128: two blocks of 8 warps an SM (the
    # default where they fit) against one (RINGATTN_CUDA_BWD_BLOCKS=1, read at each launch)
    print("\n| T | mask | backward TFLOP/s, 2 blocks an SM | 1 block an SM | 1 / 2 |")
    print("|---|---|---|---|---|")
    for T in (8192, 16384):
        for causal in (False, True):
            flop = 2.5 * 4.0 * 128 * H * (T * (T + 1) / 2 if causal else T * T)
            tf = []
            for blocks in ("2", "1"):
                os.environ["RINGATTN_CUDA_BWD_BLOCKS"] = blocks
                _, bwd = ringattn_calls(T, 128, causal)
                tf.append(flop / (best_ms(bwd, share) * 1e-3) / 1e12)
                torch.cuda.empty_cache()
            del os.environ["RINGATTN_CUDA_BWD_BLOCKS"]
            print("| %d | %s | %.1f | %.1f | %.2f |" % (T, "causal" if causal else "none", tf[0], tf[1],
                                                       tf[1] / tf[0]))
        sys.stdout.flush()
    # a fully masked row: what does each backend return? (ringattn: O = 0, LSE = -inf)
    q = torch.randn(1, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    m = torch.ones(1, 1, 4, 4, device="cuda", dtype=torch.bool)
    m[..., 0, :] = False
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("math", SDPBackend.MATH)):
        try:
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
            print(f"fully masked row, {name}: {o[0, 0, 0, :4].float().tolist()}")
        except RuntimeError as e:
            print(f"fully masked row, {name}: unavailable ({str(e).splitlines()[0][:60]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
