"""One attention case run through ringattn.torch and judged against float64 by SPEC 9."""
import random

import torch

import ringattn.torch as rt
from reference import err, explicit_backward, f32_limits, lse_err, reference

GRADS = ("dq", "dk", "dv", "dbias")


def make_inputs(seed, lengths, H, Hkv, D, Dv, dtype, lengths_k=None, bias_heads=0):
    gen = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    cu_k = None
    if lengths_k is not None:
        cu_k = [0]
        for n in lengths_k:
            cu_k.append(cu_k[-1] + n)
    tk = (cu_k or cu)[-1]
    q = torch.randn(cu[-1], H, D, generator=gen).to(dtype)
    k = torch.randn(tk, Hkv, D, generator=gen).to(dtype)
    v = torch.randn(tk, Hkv, Dv, generator=gen).to(dtype)
    bias = torch.randn(bias_heads, tk, generator=gen) if bias_heads else None
    dout = torch.randn(cu[-1], H, Dv, generator=gen).to(dtype)
    return cu, cu_k, q, k, v, bias, dout


def ringattn_run(q, k, v, bias, dout, cu, mask, **kw):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    b = None if bias is None else bias.clone().requires_grad_()
    out, lse = rt.attention(*leaves, cu, key_bias=b, **_api(mask), **kw)
    wrt = leaves + ([b] if b is not None else [])
    grads = torch.autograd.grad(out, wrt, dout)
    return out.detach(), lse, dict(zip(GRADS, grads))


def _api(mask):
    """reference()'s mask keywords as ringattn.torch.attention's."""
    m = dict(mask)
    if "slopes" in m:
        m["alibi_slopes"] = m.pop("slopes")
    return m


def float64_run(q, k, v, bias, dout, cu, mask, dtype=torch.float64):
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    b = None if bias is None else bias.detach().double().requires_grad_()
    o, lse, _, _ = reference(*leaves, cu, key_bias=b, **mask)
    wrt = leaves + ([b] if b is not None else [])
    grads = torch.autograd.grad(o, wrt, dout.to(dtype))
    return o.detach(), lse.detach(), dict(zip(GRADS, grads))


def plain_run(q, k, v, bias, dout, cu, mask):
    """SPEC 9's plain same-precision implementation (float32 arithmetic, rounded storage)."""
    o, lse, _, _ = reference(q.float(), k.float(), v.float(), cu, dtype=torch.float32,
                             key_bias=bias, **mask)
    stored = o.to(q.dtype)
    grads, _ = explicit_backward(q, k, v, dout, stored, lse, cu, dtype=torch.float32,
                                 key_bias=bias, **mask)
    return stored, lse, {n: grads[n].to(q.dtype) if n != "dbias" else grads[n]
                         for n in GRADS if n in grads}


def float64_judge(q, k, v, bias, dout, cu, mask):
    """What judge() compares with: the float64 results, SPEC 9's A_G and max |s|."""
    o64, lse64, g64 = float64_run(q, k, v, bias, dout, cu, mask)
    a, smax = explicit_backward(q, k, v, dout, o64, lse64, cu, absolute=True, key_bias=bias,
                                **mask)
    return o64, lse64, g64, a, smax


def judge(q, k, v, bias, dout, cu, mask, got, ref=None):
    """SPEC 9: errors of `got` (out, lse, grads) and their limits, by name (ref: a
    float64_judge() of the same case, computed once for several results)."""
    out, lse, grads = got
    o64, lse64, g64, a, smax = ref or float64_judge(q, k, v, bias, dout, cu, mask)
    lim_o, lim_g = f32_limits(smax)
    errors = {"o": err(out, o64, a["o"]), "lse": lse_err(lse, lse64)}
    limits = {"o": lim_o, "lse": lim_o}
    for n in grads:
        errors[n] = err(grads[n], g64[n], a[n])
        limits[n] = lim_g
    if q.dtype != torch.float32:
        po, plse, pg = plain_run(q, k, v, bias, dout, cu, mask)
        plain = {"o": err(po, o64, a["o"]), "lse": lse_err(plse, lse64)}
        plain.update({n: err(pg[n], g64[n], a[n]) for n in grads})
        limits = {n: max(limits[n], 2 * plain[n]) for n in limits}
    return errors, limits


def assert_within(errors, limits, what=""):
    bad = {n: (errors[n], limits[n]) for n in errors if not errors[n] <= limits[n]}
    assert not bad, "%s: errors above SPEC 9's limits (error, limit): %s" % (what, bad)


def random_case(seed):
    """Shapes and masks drawn at random (the random-shape sweep)."""
    r = random.Random(seed)
    hkv = r.choice([1, 2, 4])
    mask = {"causal": r.random() < 0.6}
    if r.random() < 0.5:
        mask["window"] = (r.randint(0, 40), -1 if mask["causal"] else r.randint(0, 40))
    if r.random() < 0.3:
        mask["softcap"] = r.choice([5.0, 30.0])
    shape = dict(lengths=[r.randint(1, 70) for _ in range(r.randint(1, 3))], H=hkv * r.choice([1, 2]),
                 Hkv=hkv, D=r.choice([8, 16, 24, 64]), Dv=None)
    shape["Dv"] = r.choice([shape["D"], 16])
    return shape, mask
