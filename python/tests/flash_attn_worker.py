"""One rank of test_flash_attn.py's 2-rank run over torch.distributed (gloo), started once:

    RANK=r WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python flash_attn_worker.py OUTDIR SCRIPT

1. the ring cases of flash_attn_cases.py (every ring-flash-attn family, llama3, ringattn's
   flash_attn_func / flash_attn_varlen_func with group=), and whether ringattn's layouts give
   ring-flash-attn's token orders;
2. SCRIPT, the ring-flash-attn training script with its import rewritten to ringattn's, run
   through its own main() (it finds the process group already made);
3. substitute_hf_flash_attn on a small Mistral (sliding window, two packed documents, the second
   spanning both ranks) against transformers' eager attention on one process.
Writes OUTDIR/rank<r>.pt; the script writes OUTDIR/script.pt (rank 0).
"""
import os
import runpy
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flash_attn_cases import CASES, global_rows, run_rank, shard_plan  # noqa: E402


def layouts_match(world):
    """ringattn's plan rows against ring-flash-attn's conventions where lengths divide."""
    rank, out = dist.get_rank(), {}
    for family in ("ring", "zigzag", "stripe"):
        for cu in ([0, 20, 40], [0, 12, 20, 36]):
            plan = shard_plan(cu, family, None)
            out[(family, tuple(cu))] = torch.equal(plan.index, global_rows(family, cu, rank,
                                                                            world))
    return out


def hf_check(world):
    """(logits error, gradient error) of the substituted ring against eager on one process,
    relative to the largest magnitude; computed on rank 0."""
    from transformers import MistralConfig, MistralForCausalLM
    from ringattn.ring_flash_attn import substitute_hf_flash_attn, update_ring_flash_attn_params

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                        max_position_embeddings=64, attention_dropout=0.0)
    cu = [0, 15, 40]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (1, cu[-1]), generator=gen)
    weight = torch.randn(1, cu[-1], 64, generator=gen)
    pos = torch.cat([torch.arange(b - a) for a, b in zip(cu[:-1], cu[1:])])[None]

    def model():
        torch.manual_seed(0)
        return MistralForCausalLM(cfg)

    name = substitute_hf_flash_attn(dist.group.WORLD, heads_k_stride=1)
    ring = model()
    ring.set_attn_implementation(name)
    update_ring_flash_attn_params(torch.tensor(cu, dtype=torch.int32), dist.group.WORLD)
    n, rank = cu[-1] // world, dist.get_rank()
    piece = slice(rank * n, (rank + 1) * n)
    logits = ring(ids[:, piece], position_ids=pos[:, piece], use_cache=False).logits
    (logits * weight[:, piece]).sum().backward()
    gathered = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(gathered, logits.detach().contiguous())
    grads = {k: p.grad for k, p in ring.named_parameters()}
    for g in grads.values():
        dist.all_reduce(g)
    if rank != 0:
        return None
    eager = model()
    eager.set_attn_implementation("eager")
    want = eager(ids, position_ids=pos, use_cache=False).logits
    (want * weight).sum().backward()
    got = torch.cat(gathered, dim=1)
    err_logits = ((got - want).abs().max() / want.abs().max()).item()
    err_grads = max(((grads[k] - p.grad).abs().max() / p.grad.abs().max()).item()
                    for k, p in eager.named_parameters())
    return err_logits, err_grads


def main(outdir, script):
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {"cases": {name: run_rank(name, rank, world) for name in CASES},
               "layouts": layouts_match(world)}
    runpy.run_path(script, run_name="ring_flash_attn_script")["main"](
        os.path.join(outdir, "script.pt"))
    results["hf"] = hf_check(world)
    torch.save(results, os.path.join(outdir, "rank%d.pt" % rank))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
