"""ringattn.torch on one rank against PyTorch's own attention in float64 (SPEC 9)."""
import math

import pytest
import torch

import ringattn
import ringattn.torch as rt
from cases import assert_within, judge, make_inputs, random_case, ringattn_run

MASKS = {
    "none": {},
    "causal": {"causal": True},
    "sliding_window": {"causal": True, "window": (15, -1)},
    "two_sided_window": {"window": (9, 4)},
    "softcap": {"causal": True, "softcap": 8.0},
    "alibi": {"causal": True, "slopes": [0.5, 0.25, 0.125, 0.0625]},
    "window_softcap_alibi": {"causal": True, "window": (20, -1), "softcap": 30.0,
                             "slopes": [0.3, 0.1, 0.05, 0.01]},
}
SHAPES = {  # lengths (packed sequences), H, Hkv, D, Dv
    "packed_gqa": ([37, 1, 64], 4, 2, 32, 32),
    "mha_dv": ([50, 29], 4, 4, 24, 16),
    "mqa": ([70], 4, 1, 64, 64),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_float32_against_float64(mask, shape):
    lengths, H, Hkv, D, Dv = SHAPES[shape]
    cu, _, q, k, v, _, dout = make_inputs(hash((mask, shape)) % 1000, lengths, H, Hkv, D, Dv,
                                          torch.float32)
    m = MASKS[mask]
    got = ringattn_run(q, k, v, None, dout, cu, m)
    assert_within(*judge(q, k, v, None, dout, cu, m, got), "%s %s" % (mask, shape))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", ["causal", "sliding_window", "window_softcap_alibi", "none"])
def test_half_precisions_within_twice_plain(mask, dtype):
    cu, _, q, k, v, _, dout = make_inputs(7, [45, 83], 4, 2, 64, 64, dtype)
    got = ringattn_run(q, k, v, None, dout, cu, MASKS[mask])
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    assert_within(*judge(q, k, v, None, dout, cu, MASKS[mask], got), "%s %s" % (mask, dtype))


@pytest.mark.parametrize("keep_k", [0, 5])
@pytest.mark.parametrize("bias_heads", [1, 2, 4])
def test_key_bias_and_top_k(bias_heads, keep_k):
    cu, _, q, k, v, bias, dout = make_inputs(bias_heads * 10 + keep_k, [40, 25], 4, 2, 16, 16,
                                             torch.float32, bias_heads=bias_heads)
    m = {"causal": True, "keep_k": keep_k}
    got = ringattn_run(q, k, v, bias, dout, cu, m)
    assert "dbias" in got[2]
    assert_within(*judge(q, k, v, bias, dout, cu, m, got), "bias %d keep %d" % (bias_heads, keep_k))


def test_kv_cache_keys_outnumber_queries():
    """cu_seqlens_k: bottom-right aligned queries over a longer key set (decode, prefill)."""
    cu, cu_k, q, k, v, _, dout = make_inputs(3, [4, 1, 9], 4, 2, 32, 32, torch.float32,
                                             lengths_k=[30, 17, 9])
    for m in ({"causal": True}, {"causal": True, "window": (6, -1)}, {"window": (3, 2)}):
        got = ringattn_run(q, k, v, None, dout, cu, m, cu_seqlens_k=cu_k)
        assert_within(*judge(q, k, v, None, dout, cu, dict(m, cu_k=cu_k), got), str(m))


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_and_masks(seed):
    shape, mask = random_case(seed)
    cu, _, q, k, v, _, dout = make_inputs(100 + seed, shape["lengths"], shape["H"], shape["Hkv"],
                                          shape["D"], shape["Dv"], torch.float32)
    got = ringattn_run(q, k, v, None, dout, cu, mask)
    assert_within(*judge(q, k, v, None, dout, cu, mask, got), "%s %s" % (shape, mask))


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    """A window that leaves rows without keys (SPEC 4): O = 0, LSE = -inf, never NaN."""
    cu, cu_k, q, k, v, _, dout = make_inputs(5, [6], 2, 2, 8, 8, torch.float32, lengths_k=[3])
    mask = {"window": (-1, -1), "causal": True, "cu_k": cu_k}
    out, lse, grads = ringattn_run(q, k, v, None, dout, cu, {"causal": True}, cu_seqlens_k=cu_k)
    assert torch.isneginf(lse[:, :3]).all() and torch.isfinite(lse[:, 3:]).all()
    assert (out[:3] == 0).all() and all(torch.isfinite(g).all() for g in grads.values())
    assert_within(*judge(q, k, v, None, dout, cu, mask, (out, lse, grads)), "empty rows")


def test_backward_is_deterministic():
    cu, _, q, k, v, _, dout = make_inputs(2, [90, 31], 4, 2, 32, 32, torch.float32)
    a = ringattn_run(q, k, v, None, dout, cu, {"causal": True})
    b = ringattn_run(q, k, v, None, dout, cu, {"causal": True})
    assert torch.equal(a[0], b[0]) and all(torch.equal(a[2][n], b[2][n]) for n in a[2])


def test_opcheck_forward_and_backward_ops():
    cu, _, q, k, v, bias, dout = make_inputs(4, [20, 12], 4, 2, 16, 16, torch.float32,
                                             bias_heads=2)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    slopes = torch.tensor([0.1, 0.2, 0.3, 0.4])
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cu_t, None, slopes,
            bias.requires_grad_(), True, 7, -1, 20.0, 0.0, 3, 0, 0)
    torch.library.opcheck(torch.ops.ringattn.forward.default, args)
    out, lse = torch.ops.ringattn.forward(*args)
    torch.library.opcheck(torch.ops.ringattn.backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach()) +
                          args[3:6] + (bias.detach(),) + args[7:] + (True,))
    # with sinks (SPEC 11: their gradient) and a gradient of lse
    sinks = torch.tensor([0.5, -1.0, float("-inf"), 2.0], requires_grad=True)
    torch.library.opcheck(torch.ops.ringattn.forward.default, args + (sinks,))
    out, lse = torch.ops.ringattn.forward(*args, sinks)
    torch.library.opcheck(torch.ops.ringattn.backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach()) +
                          args[3:6] + (bias.detach(),) + args[7:] +
                          (True, sinks.detach(), torch.randn_like(lse)))


class TinyAttention(torch.nn.Module):
    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x, cu):
        t = x.shape[0]
        q = self.q(x).view(t, self.heads, self.hd)
        k, v = self.kv(x).view(t, 2, self.kv_heads, self.hd).unbind(1)
        out, _ = rt.attention(q, k.contiguous(), v.contiguous(), cu, causal=True, window=(9, -1))
        return self.o(torch.nn.functional.gelu(out.reshape(t, -1)))


def test_torch_compile_fullgraph_equals_eager():
    torch.manual_seed(0)
    model = TinyAttention()
    x = torch.randn(48, 32)
    cu = torch.tensor([0, 30, 48], dtype=torch.int32)
    compiled = torch.compile(model, fullgraph=True)
    y_eager = model(x, cu)
    g_eager = torch.autograd.grad(y_eager.square().sum(), list(model.parameters()))
    y = compiled(x, cu)
    g = torch.autograd.grad(y.square().sum(), list(model.parameters()))
    torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# -- bad input: a clear exception, nothing written -------------------------------------------
def _qkv(T=16, H=2, D=8, dtype=torch.float32):
    return [torch.randn(T, H, D, dtype=dtype) for _ in range(3)]


def test_wrong_dtype_is_refused():
    q, k, v = _qkv(dtype=torch.float64)
    with pytest.raises(ValueError, match="float64"):
        rt.attention(q, k, v, [0, 16])
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="one dtype"):
        rt.attention(q, k.half(), v, [0, 16])


def test_non_contiguous_last_dim_is_refused():
    q, k, v = _qkv()
    q_t = torch.randn(16, 8, 2).transpose(1, 2)  # [16, 2, 8] with last-dim stride 2
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        rt.attention(q_t, k, v, [0, 16])


def test_mismatched_shapes_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="same tokens and heads"):
        rt.attention(q, k[:8], v, [0, 16])
    with pytest.raises(ValueError, match="plan for cu_seqlens"):
        rt.attention(q, k, v, [0, 20])
    with pytest.raises(ringattn.InvalidArgumentError, match="H % H_kv|num_kv_heads|divid"):
        rt.attention(torch.randn(16, 3, 8), k, v, [0, 16])


def test_numpy_plan_used_with_other_shapes_writes_nothing():
    import numpy as np
    plan = ringattn.Plan([0, 16], 2, 8, causal=True)
    q, k, v = (np.random.randn(16, 2, 8).astype(np.float32) for _ in range(3))
    grads_before = q.copy()
    with pytest.raises(ringattn.InvalidArgumentError, match="shape"):
        plan.forward(q[:12], k, v)
    with pytest.raises(ringattn.InvalidArgumentError, match="dtype"):
        plan.forward(q.astype(np.float16), k, v)
    out, lse = plan.forward(q, k, v)
    with pytest.raises(ringattn.InvalidArgumentError, match="shape"):
        plan.backward(q, k, v, out, lse[:1], out)
    assert np.array_equal(q, grads_before) and not np.isnan(out).any()
    assert math.isfinite(float(lse.max()))


def test_library_errors_carry_status_and_message():
    with pytest.raises(ringattn.InvalidArgumentError) as e:
        ringattn.Plan([0, 16], 2, 8, window=(-5, -1))
    assert e.value.status == 1 and "window" in e.value.message


def test_broadcast_views_are_read_as_what_they_show():
    """Issue 28, finding 4: the C API reads a stride of 0 as packed; expand() views (and the
    stride-0 gradient of a sum) must be copied by the binding, never read past their buffer."""
    cu = [0, 24, 40]
    T, H, Hkv, D = 40, 4, 2, 16
    gen = torch.Generator().manual_seed(28)
    q = torch.randn(1, H, D, generator=gen).expand(T, H, D)
    k = torch.randn(T, 1, D, generator=gen).expand(T, Hkv, D)
    v = torch.randn(T, Hkv, D, generator=gen)
    assert q.stride(0) == 0 and k.stride(1) == 0
    out, lse = rt.attention(q, k, v, cu, causal=True)
    ref_out, ref_lse = rt.attention(q.contiguous(), k.contiguous(), v, cu, causal=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    # the loss of out.sum(1) hands the backward a dO of stride 0 over the heads
    leaves = [x.contiguous().requires_grad_() for x in (q, k, v)]
    o, lse = rt.attention(*leaves, cu, causal=True)
    o.sum(1).square().sum().backward()
    dout = (2 * o.detach().sum(1, keepdim=True)).expand(T, H, D).contiguous()
    got = (o.detach(), lse, dict(zip(("dq", "dk", "dv"), (x.grad for x in leaves))))
    dense = [x.detach() for x in leaves]
    assert_within(*judge(*dense, None, dout, cu, {"causal": True}, got), "a stride-0 dO")
