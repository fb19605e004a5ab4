"""One rank of test_compile.py's 2-rank ring of compiled HF models (a process per rank: Dynamo's
tracing is not meant to run in two threads of one process at once).

    RANK=r WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python compile_worker.py OUTDIR

For each model of hf_models: the graph breaks of its forward under torch._dynamo.explain in a
zigzag ring over the three packed documents, then its logits (this rank's rows in global
places) and parameter gradients, eager and compiled with fullgraph=True (backend aot_eager).
Writes OUTDIR/rank<r>.pt.
"""
import os
import sys
from datetime import timedelta

import torch
from torch._dynamo.backends.debugging import aot_eager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ringattn  # noqa: E402
import ringattn.hf as hf  # noqa: E402
import ringattn.torch as rt  # noqa: E402
import hf_models as M  # noqa: E402


def counting(graphs):
    """aot_eager, noting the ringattn ops of each graph Dynamo hands it."""
    def backend(gm, example_inputs):
        graphs.append({str(n.target).split(".")[1] for n in gm.graph.nodes
                       if n.op == "call_function" and str(n.target).startswith("ringattn.")})
        return aot_eager(gm, example_inputs)
    return backend


def step(model, R, ids, g, **kw):
    logits, grads = M.run(model, R.shard(ids), R.shard(g), position_ids=R.position_ids, **kw)
    return R.unshard(logits), grads


def main(outdir):
    torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=120))
    comm = ringattn.Comm.from_torch()
    ids, g = M.tokens(), M.projection()
    results = {}
    for name in M.CONFIGS:
        torch._dynamo.reset()
        model = M.model(name)
        R = hf.Ring(comm, M.CU, "zigzag")
        # gemma2 gets its Ring as the model's keyword, the others as this thread's context
        kw = {"ringattn_ring": R} if name == "gemma2" else {}
        with R:
            explained = torch._dynamo.explain(model)(R.shard(ids), position_ids=R.position_ids,
                                                     use_cache=False, **kw)
            torch._dynamo.reset()
            eager = step(model, R, ids, g, **kw)
            graphs = []
            compiled = step(torch.compile(model, fullgraph=True, backend=counting(graphs)), R,
                            ids, g, **kw)
        results[name] = {"breaks": explained.graph_break_count,
                         "reasons": [b.reason for b in explained.break_reasons],
                         "graphs": explained.graph_count, "eager": eager, "compiled": compiled,
                         "compiled_ops": [sorted(ops) for ops in graphs]}
    torch.save(results, os.path.join(outdir, "rank%d.pt" % comm.rank))
    rt.clear_cache()
    comm.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
