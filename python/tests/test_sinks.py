"""SPEC 11 through ringattn.torch: attention sinks (gpt-oss) and a differentiable LSE.

The float64 reference is a dense softmax over the masked logits plus one sink column of value 0
(reference.logit_terms gives the masks), differentiated by autograd; the library's own gradients
are also checked against central differences of its own forward.
"""
import math

import pytest
import torch

import ringattn.torch as rt
from cases import make_inputs
from reference import logit_terms


def sink_reference(q, k, v, cu, sinks, causal=False, window=(-1, -1), cu_k=None):
    """out [T, H, Dv], lse [H, T] of softmax over [logits, sink] with the sink's value 0."""
    H, G = q.shape[1], q.shape[1] // k.shape[1]
    allowed, terms = logit_terms(cu, cu_k, H, causal, window, None, None, 0)
    kk, vv = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    s = torch.einsum("thd,uhd->htu", q, kk) / math.sqrt(q.shape[2]) + terms
    s = s.masked_fill(~allowed, float("-inf"))
    full = torch.cat([s, sinks.to(s.dtype)[:, None, None].expand(H, s.shape[1], 1)], dim=2)
    lse = torch.logsumexp(full, dim=2)
    p = torch.exp(s - lse[:, :, None])
    return torch.einsum("htu,uhd->thd", p, vv), lse


def losses(out, lse, dout, wlse):
    return (out.double() * dout.double()).sum() + (lse.double() * wlse.double()).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", [{"causal": True}, {"causal": True, "window": (5, 0)}, {}])
def test_sinks_and_dlse_against_float64(dtype, mask):
    cu, _, q, k, v, _, dout = make_inputs(11, [37, 1, 20], 4, 2, 16, 16, dtype)
    gen = torch.Generator().manual_seed(3)
    sinks = (2 * torch.randn(4, generator=gen)).to(dtype)
    sinks[1] = float("-inf")  # a head without a sink
    wlse = torch.randn(4, cu[-1], generator=gen)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = rt.attention(*leaves[:3], cu, sinks=leaves[3], **mask)
    grads = torch.autograd.grad(losses(out, lse, dout, wlse), leaves)
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    o64, lse64 = sink_reference(*ref_leaves[:3], cu, ref_leaves[3], **mask)
    g64 = torch.autograd.grad(losses(o64, lse64, dout, wlse), ref_leaves)
    # SPEC 9 in float32; bfloat16 inputs and outputs carry their own rounding (2^-8)
    lim_o, lim_g = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 3e-2)
    assert (out.double() - o64).abs().max() / o64.abs().max() < lim_o
    assert (lse.double() - lse64).abs().max() / lse64.abs().max() < lim_o
    for name, g, r in zip(("dq", "dk", "dv"), grads[:3], g64[:3]):
        assert (g.double() - r).abs().max() / r.abs().max() < lim_g, name
    ds = grads[3].double()
    assert ds[1] == 0 and torch.isfinite(ds).all()
    assert (ds - g64[3].nan_to_num(0.0)).abs().max() / g64[3][[0, 2, 3]].abs().max() < lim_g
    assert grads[3].dtype == dtype  # the gradient comes back in the parameter's dtype


def test_dsinks_and_dlse_match_central_differences_of_the_forward():
    """The library's backward against its own forward: L = sum(O dO) + sum(LSE w), float32
    outputs summed in float64, step 1e-2 (truncation ~1e-4 relative)."""
    cu, _, q, k, v, _, dout = make_inputs(4, [30, 17], 2, 1, 8, 8, torch.float32)
    sinks = torch.tensor([0.7, -1.3])
    wlse = torch.randn(2, cu[-1], generator=torch.Generator().manual_seed(9))
    loss = lambda s, qq: losses(*rt.attention(qq, k, v, cu, causal=True, sinks=s), dout, wlse)
    s_leaf, q_leaf = sinks.clone().requires_grad_(), q.clone().requires_grad_()
    ds, dq = torch.autograd.grad(loss(s_leaf, q_leaf), (s_leaf, q_leaf))
    h = 1e-2
    for i in range(2):
        e = torch.zeros(2)
        e[i] = h
        fd = (loss(sinks + e, q) - loss(sinks - e, q)) / (2 * h)
        assert abs(ds[i].item() - fd.item()) <= 2e-3 * max(1.0, abs(fd.item())), (i, ds, fd)
    for t, hh, c in ((0, 0, 0), (12, 1, 5), (40, 0, 7)):  # dq through both O and LSE
        e = torch.zeros_like(q)
        e[t, hh, c] = h
        fd = (loss(sinks, q + e) - loss(sinks, q - e)) / (2 * h)
        assert abs(dq[t, hh, c].item() - fd.item()) <= 2e-3 * max(1.0, abs(fd.item()))


def test_lse_is_differentiable():
    """dlse reaches the backward: a loss of lse alone has the float64 gradient in q and k."""
    cu, _, q, k, v, _, _ = make_inputs(1, [10], 2, 2, 8, 8, torch.float32)
    leaves = [x.clone().requires_grad_() for x in (q, k)]
    out, lse = rt.attention(leaves[0], leaves[1], v, cu, causal=True)
    assert out.requires_grad and lse.requires_grad
    dq, dk = torch.autograd.grad(lse.sum(), leaves)
    ref = [x.detach().double().requires_grad_() for x in (q, k)]
    _, lse64 = sink_reference(ref[0], ref[1], v.double(), cu, torch.full((2,), float("-inf")),
                              causal=True)
    r = torch.autograd.grad(lse64.sum(), ref)
    assert (dq.double() - r[0]).abs().max() / r[0].abs().max() < 1e-4
    assert (dk.double() - r[1]).abs().max() / r[1].abs().max() < 1e-4


def test_sinks_and_lse_under_fullgraph_compile():
    """The sinks and lse's gradient through torch.compile(fullgraph=True): one graph, no
    breaks, the eager op's bits (aot_eager runs the same library calls)."""
    cu, _, q, k, v, _, dout = make_inputs(6, [25, 14], 4, 2, 16, 16, torch.float32)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    sinks = torch.tensor([0.3, -2.0, 1.5, float("-inf")])

    def f(q, k, v, s):
        out, lse = rt.attention(q, k, v, cu_t, causal=True, sinks=s)
        return (out * dout).sum() + lse.sum()

    explained = torch._dynamo.explain(f)(q, k, v, sinks)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    grads = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        grads.append(torch.autograd.grad(fn(*leaves), leaves))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_flash_attn_softmax_lse_carries_its_gradient():
    """flash-attn's backward drops a gradient through softmax_lse; ringattn's compatible API
    returns ringattn's lse, whose gradient reaches q (the float64 reference's, SPEC 9)."""
    import ringattn

    cu, _, q, k, v, _, _ = make_inputs(8, [12], 2, 2, 8, 8, torch.float32)
    leaf = q.clone().requires_grad_()
    _, lse, _ = ringattn.flash_attn_func(leaf[None], k[None], v[None], causal=True,
                                         return_attn_probs=True)  # lse [1, H, S]
    (dq,) = torch.autograd.grad(lse.sum(), leaf)
    ref = q.detach().double().requires_grad_()
    _, lse64 = sink_reference(ref, k.double(), v.double(), cu,
                              torch.full((2,), float("-inf")), causal=True)
    (r,) = torch.autograd.grad(lse64.sum(), ref)
    assert (dq.double() - r).abs().max() / r.abs().max() < 1e-4
