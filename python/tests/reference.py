"""The float64 references and SPEC 9's error rule for the Python tests.

reference(): PyTorch's own attention in float64 -- scaled_dot_product_attention with the math
backend and an explicit additive mask (SPEC 2-3 and 6: windows, packed sequences, ALiBi, key
bias, top-k), or, with a softcap (which SDPA cannot express), the same logits built from torch
ops -- differentiated by autograd. plain(): SPEC 9's "plain same-precision implementation" for
float16/bfloat16 (float32 arithmetic on the rounded inputs, outputs rounded, the backward from
its own stored O and LSE). judge(): SPEC 9's norms and limits.
"""
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def _positions(cu):
    seq = torch.zeros(cu[-1], dtype=torch.long)
    pos = torch.zeros(cu[-1], dtype=torch.long)
    for s in range(len(cu) - 1):
        seq[cu[s]:cu[s + 1]] = s
        pos[cu[s]:cu[s + 1]] = torch.arange(cu[s + 1] - cu[s])
    return seq, pos


def logit_terms(cu, cu_k, H, causal, window, slopes, key_bias, keep_k):
    """allowed [H, Tq, Tk] (bool) and the additive terms [H, Tq, Tk] (ALiBi + key bias)."""
    cu_k = cu if cu_k is None else cu_k
    sq, pq = _positions(cu)
    sk, pk = _positions(cu_k)
    lq = torch.tensor([cu[s + 1] - cu[s] for s in range(len(cu) - 1)])
    lk = torch.tensor([cu_k[s + 1] - cu_k[s] for s in range(len(cu_k) - 1)])
    delta = (lk - lq)[sq][:, None]
    wl, wr = window
    if causal:
        wr = 0
    rel = pq[:, None] + delta - pk[None, :]  # p_i + delta - p_j
    allowed = sq[:, None] == sk[None, :]
    if wl >= 0:
        allowed &= rel <= wl
    if wr >= 0:
        allowed &= -rel <= wr
    allowed = allowed[None].expand(H, -1, -1).clone()
    add = torch.zeros(allowed.shape, dtype=torch.float64)
    if slopes is not None:
        add -= torch.as_tensor(slopes, dtype=torch.float64)[:, None, None] * rel.abs()[None]
    if key_bias is not None:
        hb = key_bias.shape[0]
        b = key_bias.double()[torch.arange(H) // (H // hb)]  # [H, Tk]
        add += b[:, None, :]
        if keep_k > 0:  # SPEC 6: the keep_k largest valid biases, ties to the lower position
            tk = b.shape[1]
            order = torch.arange(tk, dtype=torch.float64)
            for h in range(H):
                score = b[h][None, :].expand(allowed.shape[1], -1)
                rank_key = torch.where(allowed[h], score, torch.tensor(-math.inf, dtype=torch.float64))
                # rank: keys before j in (bias desc, position asc) order
                better = (rank_key[:, None, :] > rank_key[:, :, None]) | (
                    (rank_key[:, None, :] == rank_key[:, :, None]) &
                    (order[None, None, :] < order[None, :, None]))
                better &= allowed[h][:, None, :]
                allowed[h] &= better.sum(-1) < keep_k
    return allowed, add


def _repeat(x, H):
    return x.repeat_interleave(H // x.shape[1], dim=1)


def reference(q, k, v, cu, cu_k=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None,
              scale=None, key_bias=None, keep_k=0, dtype=torch.float64):
    """O [T, H, Dv] and LSE [H, T] of attention, differentiable; in `dtype` arithmetic."""
    H, D = q.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(D) if not scale else scale
    allowed, add = logit_terms(cu, cu_k, H, causal, window, slopes, key_bias, keep_k)
    add = add.to(dtype)
    qh, kh, vh = (x.to(dtype).transpose(0, 1) for x in (q, _repeat(k, H), _repeat(v, H)))
    empty = ~allowed.any(-1)  # rows with no allowed key: O = 0, LSE = -inf
    z = scale * qh @ kh.transpose(1, 2)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    s = torch.where(allowed, z + add, torch.tensor(-math.inf, dtype=dtype))
    lse = torch.logsumexp(s, dim=-1)
    if softcap or dtype != torch.float64:
        p = torch.exp(s - torch.where(empty, 0, lse)[..., None])
        o = p @ vh
    else:  # PyTorch's own attention, math backend, explicit mask
        mask = torch.where(allowed | empty[..., None], add, torch.tensor(-math.inf, dtype=dtype))
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask,
                                                                 scale=scale)
    o = torch.where(empty[..., None], 0, o)
    return o.transpose(0, 1), lse, s, allowed


def explicit_backward(q, k, v, dout, o, lse, cu, absolute=False, dtype=torch.float64, **mask):
    """SPEC 7's gradients from P = exp(s - LSE) and dS = P (dP - rowsum(dO o O)), in `dtype`
    arithmetic from the given (stored) O and LSE; absolute: SPEC 9's A_G, the same sums over
    the absolute values of their terms. Returns ({name: tensor}, max |s| over allowed pairs)."""
    H, D = q.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(D) if not mask.get("scale") else mask["scale"]
    qd, kd, vd, dod, od = (x.detach().to(dtype) for x in (q, k, v, dout, o))
    _, _, s, allowed = reference(qd, kd, vd, cu, dtype=dtype, **mask)
    lse = lse.to(dtype)
    p = torch.where(allowed, torch.exp(s - torch.where(torch.isinf(lse), 0, lse)[..., None]), 0)
    qh, kh, vh, doh, oh = (x.transpose(0, 1) for x in (qd, _repeat(kd, H), _repeat(vd, H), dod, od))
    ab = (lambda x: x.abs()) if absolute else (lambda x: x)
    dp, dsum = ab(doh) @ ab(vh).transpose(1, 2), (ab(doh) * ab(oh)).sum(-1, keepdim=True)
    ds = p * (dp + dsum if absolute else dp - dsum)
    dz = ds
    if mask.get("softcap"):
        z = scale * qh @ kh.transpose(1, 2)
        dz = ds * (1 - torch.tanh(z / mask["softcap"]) ** 2)
    g = H // k.shape[1]

    def group(x):  # [H, T, c] summed over each kv head's query heads -> [T, Hkv, c]
        return x.reshape(k.shape[1], g, *x.shape[1:]).sum(1).transpose(0, 1)

    out = {"o": (p @ ab(vh)).transpose(0, 1),
           "dq": (scale * ab(dz) @ ab(kh)).transpose(0, 1),
           "dk": group(scale * ab(dz).transpose(1, 2) @ ab(qh)),
           "dv": group(p.transpose(1, 2) @ ab(doh))}
    if mask.get("key_bias") is not None:
        hb = mask["key_bias"].shape[0]
        out["dbias"] = ab(ds).sum(1).reshape(hb, H // hb, -1).sum(1)
    smax = torch.where(allowed, s, 0).abs().max().item()
    return out, smax


def err(x, ref, a):
    ref = ref.double()
    denom = max(ref.abs().max().item(), 0.1 * a.max().item(), 1e-300)
    return (x.double() - ref).abs().max().item() / denom


def lse_err(x, ref):
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(x), finite) or not torch.equal(
            x[~finite], ref[~finite].to(x.dtype)):
        return math.inf
    if not finite.any():
        return 0.0
    d = (x.double() - ref)[finite].abs() / ref[finite].abs().clamp(min=1)
    return d.max().item()


def f32_limits(smax):
    f = max(1.0, smax / 16)
    return 1e-5 * f, 1e-4 * f
