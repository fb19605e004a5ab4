"""Ring cases shared by the threads, mpi4py and torch.distributed tests.

Every rank builds the same global inputs from a seed, takes its shard (rt.shard), runs the
ring forward and backward over its comm, and returns its outputs put back in global places
(rt.unshard, zeros elsewhere): the sum over ranks is the ring's whole result, which the test
judges against float64 (SPEC 9) and compares with the single-rank run.
"""
import torch

import ringattn.torch as rt
from cases import _api, make_inputs

CASES = {
    "causal_packed_gqa": (dict(lengths=[37, 60, 9], H=4, Hkv=2, D=16, Dv=16), {"causal": True}),
    "window_softcap": (dict(lengths=[70, 33], H=2, Hkv=2, D=32, Dv=32),
                       {"causal": True, "window": (11, -1), "softcap": 20.0}),
    "bidirectional_alibi": (dict(lengths=[50], H=2, Hkv=1, D=8, Dv=16),
                            {"window": (7, 5), "slopes": [0.25, 0.5]}),
}
LAYOUTS = ("contiguous", "zigzag", "striped")


def inputs(name):
    shape, mask = CASES[name]
    cu, _, q, k, v, _, dout = make_inputs(sum(map(ord, name)), shape["lengths"], shape["H"],
                                          shape["Hkv"], shape["D"], shape["Dv"], torch.float32)
    return cu, q, k, v, dout, mask


def run_rank(name, layout, comm):
    """This rank's part of the ring: {out, lse, dq, dk, dv} in global places, zeros elsewhere."""
    cu, q, k, v, dout, mask = inputs(name)
    sp = rt.plan(cu, layout=layout, comm=comm)
    local = [rt.shard(x, sp).detach().requires_grad_() for x in (q, k, v)]
    out, lse = rt.attention(*local, cu, layout=layout, comm=comm, **_api(mask))
    dq, dk, dv = torch.autograd.grad(out, local, rt.shard(dout, sp))
    result = {n: rt.unshard(x.detach(), sp) for n, x in
              (("out", out), ("dq", dq), ("dk", dk), ("dv", dv))}
    result["lse"] = rt.unshard(lse.t().contiguous(), sp).t()
    return result


def combine(parts):
    """The ranks' pieces summed into the whole result."""
    return {n: sum(p[n] for p in parts) for n in parts[0]}
