"""The ring from Python: threads in one process, mpirun with mpi4py, and torch.distributed (gloo)
processes over the custom transport; each judged against float64 by SPEC 9 and compared with
the single-rank result."""
import os
import shutil
import subprocess
import sys
import threading
from functools import lru_cache

import pytest
import torch

import ringattn
import ranks
from cases import assert_within, float64_judge, judge
from ring_cases import CASES, LAYOUTS, combine, inputs, run_rank

HERE = os.path.dirname(os.path.abspath(__file__))


@lru_cache(maxsize=None)
def reference(name):
    cu, q, k, v, dout, mask = inputs(name)
    return float64_judge(q, k, v, None, dout, cu, mask)


def check_ring(name, layout, whole, single):
    cu, q, k, v, dout, mask = inputs(name)
    got = (whole["out"], whole["lse"], {n: whole[n] for n in ("dq", "dk", "dv")})
    errors, limits = judge(q, k, v, None, dout, cu, mask, got, reference(name))
    assert_within(errors, limits, "ring %s %s" % (name, layout))
    for n in ("out", "dq", "dk", "dv"):  # the ring equals one rank within the same limits
        scale = max(single[n].abs().max().item(), 1e-30)
        limit = limits["o" if n == "out" else n]
        assert (whole[n] - single[n]).abs().max().item() / scale <= 2 * limit, (name, layout, n)


@lru_cache(maxsize=None)
def single_rank(name):
    return run_rank(name, "contiguous", None)


def run_threads(P, name, layout):
    comms = ringattn.Comm.threads(P)
    parts, errors = [None] * P, []

    def rank(r):
        try:
            parts[r] = run_rank(name, layout, comms[r])
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.close()
    if errors:
        raise errors[0]
    return combine(parts)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("P", [2, 3])
def test_threads_ring(P, layout):
    for name in CASES:
        check_ring(name, layout, run_threads(P, name, layout), single_rank(name))


def _collect(outdir, P):
    parts = [torch.load(os.path.join(outdir, "rank%d.pt" % r)) for r in range(P)]
    for name in CASES:
        single = single_rank(name)
        for layout in LAYOUTS:
            check_ring(name, layout, combine([p[(name, layout)] for p in parts]), single)


def _env():
    env = dict(os.environ, RINGATTN_COMM_TIMEOUT="30", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    return env


# The process rings run 3 ranks (the threads ring above covers 2 and 3): most of each run is
# starting Python and torch in every rank; examples/python runs 2 ranks under torchrun.
PROCESS_RANKS = 3


def test_mpirun_mpi4py_ring(tmp_path, P=PROCESS_RANKS):
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is needed (Open MPI: cmake/install-deps.sh installs it)"
    cmd = [mpirun, "-n", str(P), "--oversubscribe", "--allow-run-as-root", sys.executable,
           os.path.join(HERE, "ring_worker.py"), "mpi", str(tmp_path)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    _collect(tmp_path, P)


def test_torch_distributed_gloo_ring(tmp_path, P=PROCESS_RANKS):
    ranks.processes("ring_worker.py", ["gloo", tmp_path], P, comm_timeout=30)
    _collect(tmp_path, P)
