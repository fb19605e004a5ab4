"""2D context parallelism from Python (ringattn.Grid: Ulysses inside groups of P_u ranks, the ring
across P_r groups) on a 2x2 grid: threads of this process (a comm split by the library, with
consecutive and strided groups, and a Grid of two comms) and 4 torch.distributed gloo processes
(flash_attn's group= as a pair of process groups and as DeviceMeshes). Each is judged against
float64 (SPEC 9), compared with the flat 4-rank ring (1e-5), and its rows checked against the
placement ringattn.h documents."""
import functools

import numpy as np
import pytest
import torch

import grid_cases as gc
import ranks
import ringattn
from cases import assert_within, float64_judge, judge

TOL = 1e-5  # the 2D grid against the flat ring, float32, relative to the largest value


@functools.lru_cache(maxsize=None)
def reference(name):
    cu, q, k, v, dout = gc.inputs(name)
    return float64_judge(q, k, v, None, dout, cu, gc.MASK)


def check(name, whole, flat, what):
    cu, q, k, v, dout = gc.inputs(name)
    got = (whole["out"], whole["lse"], {n: whole[n] for n in ("dq", "dk", "dv")})
    assert_within(*judge(q, k, v, None, dout, cu, gc.MASK, got, reference(name)), what)
    for n in ("out", "lse", "dq", "dk", "dv"):
        diff = (whole[n] - flat[n]).abs().max().item() / max(flat[n].abs().max().item(), 1.0)
        assert diff <= TOL, "%s: %s differs from the flat ring by %g" % (what, n, diff)


def check_rows(parts, name, coords, what):
    cu, layout = gc.inputs(name)[0], gc.CASES[name][2]
    for r, (p, (group, member)) in enumerate(zip(parts, coords)):
        want = gc.expected_rows(cu, layout, group, member)
        assert p["rows"].tolist() == want, "%s: rank %d (group %d, member %d) holds other rows" % (
            what, r, group, member)


def test_grid_threads():
    """A 4-rank threads comm: flat; split by the library into groups of 2 consecutive ranks
    (ulysses_size=2) and strided ones; a Grid of two comms of the caller's."""
    groups = [ringattn.Comm.threads(gc.PU) for _ in range(gc.PR)]  # groups[g][m]
    rings = [ringattn.Comm.threads(gc.PR) for _ in range(gc.PU)]   # rings[m][g]

    def body(comm, r):
        g, m = divmod(r, gc.PU)
        pair = ringattn.Grid(groups[g][m], rings[m][g])
        assert (pair.rank, pair.size, pair.ulysses_size, pair.ring_size) == (r, 4, 2, 2)
        kinds = {"flat": (comm, {}), "split": (comm, dict(ulysses_size=gc.PU)),
                 "strided": (comm, dict(ulysses_size=gc.PU, ulysses_strided=True)),
                 "pair": (pair, {})}
        out = {k: {n: gc.run_rank(n, c, **kw) for n in gc.CASES} for k, (c, kw) in kinds.items()}
        # the plan's info tells the grid; a numpy plan's scatter / gather follow its rows
        cu, q = gc.inputs("gqa_hkv2")[:2]
        plan = ringattn.Plan(cu, gc.H, gc.D, num_kv_heads=2, causal=True, comm=pair)
        info = plan.info()
        out["info"] = {k: info[k] for k in ("rank", "ranks", "ulysses_size", "ring_size")}
        out["alltoall"] = [info["alltoall_%s_bytes_%s" % (c, d)]
                           for c in ("forward", "backward") for d in ("sent", "received")]
        flat_info = ringattn.Plan(cu, gc.H, gc.D, comm=comm).info()
        out["flat_info"] = (flat_info["ulysses_size"], flat_info["ring_size"],
                            flat_info["alltoall_forward_bytes_sent"])
        g_np = q.numpy()
        local = plan.scatter(g_np)
        assert np.array_equal(local, g_np[plan.local_tokens()])
        back = plan.gather(local)
        assert np.array_equal(back[plan.local_tokens()], local)
        return out

    try:
        parts = ranks.threads(body, gc.P)
    finally:
        for c in [c for cs in groups + rings for c in cs]:
            c.close()
    coords = {"split": [divmod(r, gc.PU) for r in range(gc.P)],
              "pair": [divmod(r, gc.PU) for r in range(gc.P)],
              "strided": [(r % gc.PR, r // gc.PR) for r in range(gc.P)]}
    for name in gc.CASES:
        flat = gc.combine([p["flat"][name] for p in parts], name)
        check(name, flat, flat, "flat %s" % name)
        for kind in ("split", "strided", "pair"):
            mine = [p[kind][name] for p in parts]
            check_rows(mine, name, coords[kind], "%s %s" % (kind, name))
            check(name, gc.combine(mine, name), flat, "%s %s" % (kind, name))
    for r, p in enumerate(parts):
        assert p["info"] == {"rank": r, "ranks": 4, "ulysses_size": 2, "ring_size": 2}
        assert all(b > 0 for b in p["alltoall"]), p["alltoall"]
        assert p["flat_info"] == (1, 4, 0)


def test_grid_torch_distributed_gloo(tmp_path):
    ranks.processes("grid_worker.py", [tmp_path], gc.P, comm_timeout=30)
    parts = [torch.load(tmp_path / ("rank%d.pt" % r)) for r in range(gc.P)]
    for name in gc.CASES:
        flat = gc.combine([p["flat"][name] for p in parts], name)
        check(name, flat, flat, "flat %s" % name)
        for kind in ("pair", "mesh", "mesh_swapped"):
            mine = [p[kind][name] for p in parts]
            check_rows(mine, name, [p["coords"][kind] for p in parts], "%s %s" % (kind, name))
            check(name, gc.combine(mine, name), flat, "%s %s" % (kind, name))


def test_grid_refusals():
    comm = ringattn.Comm.threads(1)[0]
    try:
        with pytest.raises(ringattn.InvalidArgumentError, match="does not divide"):
            comm.grid(2)
        with pytest.raises(ringattn.InvalidArgumentError, match="needs a comm"):
            ringattn.Plan([0, 8], 2, 8, ulysses_size=2)
        with pytest.raises(ringattn.InvalidArgumentError, match="must be a ringattn.Comm"):
            ringattn.Grid(comm, None)
    finally:
        comm.close()
    from ringattn import ring_flash_attn as rfa
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(NotImplementedError, match="flat ring"):
        rfa.ring_flash_attn_func(q, q, q, group=(None, None))


def test_plan_info_has_the_grid_fields_on_one_rank():
    info = ringattn.Plan([0, 8], 2, 8).info()
    assert (info["ulysses_size"], info["ring_size"]) == (1, 1)
    assert info["alltoall_forward_bytes_sent"] == info["alltoall_backward_bytes_received"] == 0
