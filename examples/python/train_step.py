"""A training step of one attention block with ring attention across ranks.

    torchrun --nproc-per-node 2 examples/python/train_step.py            (torch.distributed, gloo)
    mpirun -n 2 python examples/python/train_step.py                     (mpi4py)
    torchrun --nproc-per-node 2 examples/python/train_step.py --device cuda   (NCCL, a GPU each)

Every rank makes the same global batch (packed sequences), keeps its shard under the layout
(ringattn.torch.shard), rotates its queries and keys by their positions within their sequences
(ringattn.torch.positions), runs the block forward, the loss and the backward, sums the
parameter gradients over the ranks and takes an optimiser step. Rank 0 then checks the step
against the same block run on one process with PyTorch's own attention.
"""
import argparse
import math
import os
import time

import torch

import ringattn
import ringattn.torch as rt


class Block(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, window):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.window = heads, kv_heads, dim // heads, window
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.out = torch.nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, pos, attend):
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, -1, self.hd).split([self.heads, self.kv_heads,
                                                           self.kv_heads], dim=1)
        q, k = rope(q, pos), rope(k, pos)
        return x + self.out(attend(q, k, v.contiguous()).reshape(t, -1))


def rope(x, pos):
    half = x.shape[-1] // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device) / half)
    ang = pos[:, None, None].to(x.dtype) * freq
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1)


def eager_attention(cu, window):
    """PyTorch's own attention, one sequence at a time: what rank 0 checks against."""
    def attend(q, k, v):
        outs = []
        for s in range(len(cu) - 1):
            qs, ks, vs = (x[cu[s]:cu[s + 1]].transpose(0, 1) for x in (q, k, v))
            g = qs.shape[0] // ks.shape[0]
            ks, vs = ks.repeat_interleave(g, 0), vs.repeat_interleave(g, 0)
            n = qs.shape[1]
            i = torch.arange(n, device=q.device)
            allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= window)
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=allowed).transpose(0, 1))
        return torch.cat(outs)
    return attend


def setup(device):
    """(comm, rank, size, allreduce) from torchrun's or mpirun's environment."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch.distributed as dist
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

        def allreduce(t):
            dist.all_reduce(t)
        return ringattn.Comm.from_torch(device=device), dist.get_rank(), dist.get_world_size(), \
            allreduce
    from mpi4py import MPI
    world = MPI.COMM_WORLD

    def allreduce(t):
        world.Allreduce(MPI.IN_PLACE, t.detach().cpu().numpy())
    return ringattn.Comm.from_mpi4py(world), world.Get_rank(), world.Get_size(), allreduce


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="3000,1096", help="the packed batch's sequence lengths")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--window", type=int, default=1024, help="sliding window (keys before)")
    ap.add_argument("--layout", default="zigzag", choices=["contiguous", "zigzag", "striped"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    comm, rank, size, allreduce = setup(device)

    lengths = [int(n) for n in args.seqlens.split(",")]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    torch.manual_seed(0)
    block = Block(args.dim, args.heads, args.kv_heads, args.window).to(device)
    reference = Block(args.dim, args.heads, args.kv_heads, args.window).to(device)
    reference.load_state_dict(block.state_dict())
    x = torch.randn(cu[-1], args.dim, device=device)
    target = torch.randn(cu[-1], args.dim, device=device)

    sp = rt.plan(cu, layout=args.layout, comm=comm)
    x_local, target_local = rt.shard(x, sp), rt.shard(target, sp)
    pos = rt.positions(sp).to(device)

    def ring(q, k, v):
        return rt.attention(q, k, v, cu, causal=True, window=(args.window, -1),
                            layout=args.layout, comm=comm)[0]

    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    for step in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        # the mean over the whole batch: each rank's share of the sum, divided by all tokens
        loss = (block(x_local, pos, ring) - target_local).square().sum() / target.numel()
        loss.backward()
        for p in block.parameters():
            allreduce(p.grad)
        total = loss.detach().clone()
        allreduce(total)
        grads = [p.grad.clone() for p in block.parameters()]
        opt.step()
        if rank == 0:
            print("step %d: loss %.6f, %.1f ms (ranks %d, %d tokens, layout %s, %s)" %
                  (step, total.item(), 1e3 * (time.perf_counter() - start), size, cu[-1],
                   args.layout, device))
        if step == 0 and rank == 0:
            seq_pos = torch.cat([torch.arange(n, device=device) for n in lengths])
            ref_loss = (reference(x, seq_pos, eager_attention(cu, args.window)) -
                        target).square().mean()
            ref_loss.backward()
            gerr = max(((g - p.grad).abs().max() / p.grad.abs().max()).item()
                       for g, p in zip(grads, reference.parameters()))
            print("against one process with PyTorch's attention: loss error %.2e, gradient "
                  "error %.2e (max relative to each parameter's largest)" %
                  (abs(total.item() - ref_loss.item()), gerr))
    rt.clear_cache()
    comm.close()


if __name__ == "__main__":
    main()
