"""One rank of test_grid.py's 4-rank torch.distributed (gloo) run of 2D context parallelism:

    RANK=r WORLD_SIZE=4 MASTER_ADDR=.. MASTER_PORT=.. python grid_worker.py OUTDIR

Every case of grid_cases.py through ringattn.flash_attn_varlen_func with group= set four ways:
the flat ring (the default group), the pair (ulysses_group, ring_group) of groups of consecutive
ranks, a DeviceMesh named ("ring", "ulysses"), and one named ("cp_ulysses", "cp_ring") -- dim 0
Ulysses, so that its groups are strided (ranks r and r + 2): names, not positions, must decide.
Writes OUTDIR/rank<r>.pt: {kind: {case: local results}} and each 2D kind's (group, member) of
this rank, the grid coordinates its rows must follow.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grid_cases import CASES, PR, PU, run_rank_flash  # noqa: E402


def main(outdir):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    # every rank makes every group, in one order (new_group is collective over the world)
    ulysses = [dist.new_group([g * PU + m for m in range(PU)]) for g in range(PR)]
    ring = [dist.new_group([g * PU + m for g in range(PR)]) for m in range(PU)]
    pair = (ulysses[rank // PU], ring[rank % PU])
    named = init_device_mesh("cpu", (PR, PU), mesh_dim_names=("ring", "ulysses"))
    swapped = init_device_mesh("cpu", (PU, PR), mesh_dim_names=("cp_ulysses", "cp_ring"))
    kinds = {"flat": (dist.group.WORLD, None), "pair": (pair, (rank // PU, rank % PU)),
             "mesh": (named, (rank // PU, rank % PU)),
             # mesh[u][g] = u * PR + g: rank r is member r // PR of group r % PR
             "mesh_swapped": (swapped, (rank % PR, rank // PR))}
    results = {"coords": {k: c for k, (_, c) in kinds.items()}}
    for kind, (group, _) in kinds.items():
        results[kind] = {name: run_rank_flash(name, group) for name in CASES}
    torch.save(results, os.path.join(outdir, "rank%d.pt" % rank))
    import ringattn.torch as rt
    rt.clear_cache()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
