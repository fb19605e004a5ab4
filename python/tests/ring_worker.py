"""One rank of the multi-process ring tests (test_ring.py starts it).

    mpirun -n P python ring_worker.py mpi OUTDIR          (mpi4py: Comm.from_mpi4py)
    RANK=r WORLD_SIZE=P MASTER_ADDR=.. MASTER_PORT=.. python ring_worker.py gloo OUTDIR
                                                          (torch.distributed: Comm.from_torch)
Writes OUTDIR/rank<r>.pt: {(case, layout): run_rank's result} for every case and layout.
"""
import os
import sys
from datetime import timedelta

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ringattn  # noqa: E402
from ring_cases import CASES, LAYOUTS, run_rank  # noqa: E402


def main(kind, outdir):
    if kind == "mpi":
        from mpi4py import MPI
        comm = ringattn.Comm.from_mpi4py(MPI.COMM_WORLD)
    elif kind == "gloo":
        torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=60))
        comm = ringattn.Comm.from_torch()
    else:
        raise SystemExit("ring_worker.py: kind must be mpi or gloo, got %r" % kind)
    results = {(name, layout): run_rank(name, layout, comm) for name in CASES for layout in LAYOUTS}
    torch.save(results, os.path.join(outdir, "rank%d.pt" % comm.rank))
    import ringattn.torch as rt
    rt.clear_cache()
    comm.close()
    if kind == "gloo":
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
