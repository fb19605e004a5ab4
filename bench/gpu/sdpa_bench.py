"""PyTorch SDPA's flash and cuDNN backends on the shapes of fwd_tile_gpu bench and
bench_ring_cuda (the H200 check's anchor, CUDA.md section 4): forward and backward TFLOP/s,
bf16, T = 4K and 16K, H = 16, D = 64 and 128, full and causal, best of 10 after 3 warm-ups; and
what each returns for a fully masked row.
Prints a markdown table; exits 77 without torch or a GPU."""
import sys

try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
except Exception as e:  # noqa: BLE001 - any import failure means: nothing to compare with
    print(f"sdpa_bench: no torch ({e}): skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("sdpa_bench: no CUDA device visible: skipped")
    sys.exit(77)

F = torch.nn.functional


def best_ms(fn, reps=10, warm=3):
    """Best of reps CUDA-event timings of fn() after warm calls."""
    for _ in range(warm):
        fn()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b))
    return best


print("| backend | T | H | D | mask | pass | ms | TFLOP/s |\n|---|---|---|---|---|---|---|---|")
for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    for T in (4096, 16384):
        for D in (64, 128):
            for causal in (False, True):
                shape = f"| {name} | {T} | 16 | {D} | {'causal' if causal else 'full'} |"
                q, k, v = (torch.randn(1, 16, T, D, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                g = torch.randn_like(q)
                # FlashAttention's count: 4 D flop per allowed pair and head forward, 2.5x backward
                flop = 4.0 * T * T * 16 * D * (0.5 if causal else 1.0)
                try:
                    with sdpa_kernel(backend):
                        fwd = best_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        bwd = best_ms(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
                    for pas, ms, f in (("forward", fwd, flop), ("backward", bwd, 2.5 * flop)):
                        print(f"{shape} {pas} | {ms:.3f} | {f / (ms * 1e-3) / 1e12:.1f} |")
                except RuntimeError as e:
                    print(f"{shape} - | - | unavailable: {str(e).splitlines()[0][:60]} |")
# a fully masked row: what does each backend return? (ringattn: O = 0, LSE = -inf)
q = torch.randn(1, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
mask = torch.ones(1, 1, 4, 4, device="cuda", dtype=torch.bool)
mask[..., 0, :] = False
for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                      ("math", SDPBackend.MATH)):
    try:
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        print(f"fully masked row, {name}: {o[0, 0, 0, :4].float().tolist()}")
    except RuntimeError as e:
        print(f"fully masked row, {name}: unavailable ({str(e).splitlines()[0][:60]})")
