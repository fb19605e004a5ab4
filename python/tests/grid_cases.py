"""2D context parallelism (ringattn.Grid) cases shared by the threads test and the gloo rank
processes (test_grid.py, grid_worker.py).

A 2x2 grid (P_u = 2 ranks in a group, P_r = 2 groups) runs causal GQA cases, with fewer kv heads
than P_u (each replicated in a group) and as many; every rank takes its rows (rt.plan's, or
ringattn.flash_attn.shard_plan's), runs the forward and backward, and returns its local results
with their global rows. The test puts them in place, checks the rows against SPEC 8's layout
and the grid's documented placement (expected_rows, written from the header's words, not from
the library), and judges the whole result against float64 and against the flat 4-rank ring.
"""
import torch

import ringattn.torch as rt
import flash_attn_cases
from cases import make_inputs

PU, PR = 2, 2
P = PU * PR
H, D = 4, 16
# kv heads below P_u (replicated in a group) and at P_u (split); odd lengths: uneven pieces
CASES = {"gqa_hkv1": (1, [37, 60, 9], "zigzag"), "gqa_hkv2": (2, [29, 40], "contiguous")}
MASK = {"causal": True}


def inputs(name):
    hkv, lengths, _ = CASES[name]
    cu, _, q, k, v, _, dout = make_inputs(sum(map(ord, name)), lengths, H, hkv, D, D,
                                          torch.float32)
    return cu, q, k, v, dout


def _chunks(n, parts):
    """SPEC 8: n tokens in `parts` chunks, the first n mod parts one token longer."""
    sizes = [n // parts + (i < n % parts) for i in range(parts)]
    starts = [sum(sizes[:i]) for i in range(parts)]
    return [range(s, s + z) for s, z in zip(starts, sizes)]


def layout_rows(cu, layout, rank, ranks):
    """SPEC 8: the rows rank `rank` of a flat ring of `ranks` holds, in local order."""
    rows = []
    for a, b in zip(cu[:-1], cu[1:]):
        if layout == "contiguous":
            piece = list(_chunks(b - a, ranks)[rank])
        elif layout == "zigzag":
            ch = _chunks(b - a, 2 * ranks)
            piece = list(ch[rank]) + list(ch[2 * ranks - 1 - rank])
        else:
            piece = list(range(rank, b - a, ranks))
        rows += [a + t for t in piece]
    return rows


def expected_rows(cu, layout, group, member):
    """ringattn.h: the layout splits the tokens among the P_r groups as a ring of P_r ranks; a
    group's tokens are then split among its P_u ranks in P_u consecutive pieces."""
    rows = layout_rows(cu, layout, group, PR)
    n = len(rows)
    return rows[member * n // PU:(member + 1) * n // PU]


def run_rank(name, comm, **kw):
    """ringattn.torch on this rank's rows of case `name` over comm (a Comm, a Grid, or a Comm
    with ulysses_size=...): {rows, out, lse [H, rows], dq, dk, dv} (local rows)."""
    cu, q, k, v, dout = inputs(name)
    layout = CASES[name][2]
    sp = rt.plan(cu, layout=layout, comm=comm, **kw)
    local = [rt.shard(x, sp).detach().requires_grad_() for x in (q, k, v)]
    out, lse = rt.attention(*local, cu, layout=layout, comm=comm, **MASK, **kw)
    dq, dk, dv = torch.autograd.grad(out, local, rt.shard(dout, sp))
    return {"rows": sp.index, "out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk,
            "dv": dv}


def run_rank_flash(name, group):
    """The same through ringattn.flash_attn_varlen_func with group= (a process group, a pair
    (ulysses_group, ring_group) or a DeviceMesh) and its shard_plan's rows."""
    import ringattn
    from ringattn.flash_attn import shard_plan

    cu, q, k, v, dout = inputs(name)
    layout = CASES[name][2]
    rows = shard_plan(cu, group=group, layout=layout).index
    local = [x[rows].detach().clone().requires_grad_() for x in (q, k, v)]
    cu_t = torch.tensor(cu, dtype=torch.int32)
    longest = int(cu_t.diff().max())
    out, lse, _ = ringattn.flash_attn_varlen_func(*local, cu_t, cu_t, longest, longest,
                                                  return_attn_probs=True, group=group,
                                                  layout=layout, **MASK)
    dq, dk, dv = torch.autograd.grad(out, local, dout[rows])
    return {"rows": rows, "out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk,
            "dv": dv}


def combine(parts, name):
    """The ranks' local results in their global rows; every row must be held by one rank."""
    cu, q, k, v, _ = inputs(name)
    rows = torch.cat([p["rows"] for p in parts])
    assert torch.equal(rows.sort().values, torch.arange(cu[-1])), "rows not a partition"
    return flash_attn_cases.combine(parts, cu, q, k, v)
