"""A sequence-parallel training step written for ring-flash-attn (github zhuzilin/ring-flash-attention)
from its documented API only: its entry points, and the shards its tests give each rank
(extract_local: contiguous chunks, zigzag chunks r and 2P-1-r, stripes r::P, local cu_seqlens =
global / P, llama3 pieces of the packed stream with llama3_flash_attn_prepare_cu_seqlens).

    torchrun --nproc-per-node 2 ring_flash_attn_train.py OUT.pt

test_flash_attn.py runs it on ringattn by rewriting its one import line to
ringattn.ring_flash_attn. Every experiment trains a small attention model for STEPS SGD steps,
each rank on its shard of the same packed batch, summing the parameters' gradients over the
ranks; rank 0 saves the losses and the first step's gradients. reference(name) is the same
training on one process in float64, attention by torch's SDPA with an explicit mask.
CPU and float32 here (gloo); with flash-attn on GPUs one would pick CUDA and bfloat16.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ring_flash_attn import (llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func,
                             ring_flash_attn_func, ring_flash_attn_varlen_func,
                             stripe_flash_attn_func, zigzag_ring_flash_attn_func,
                             zigzag_ring_flash_attn_varlen_qkvpacked_func)

VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM = 48, 32, 4, 2, 8
STEPS, LR = 2, 0.5

# name: (batch rows x length, or the packed batch's cu_seqlens; causal)
EXPERIMENTS = {
    "zigzag_ring_flash_attn_func": ((2, 24), True),
    "stripe_flash_attn_func": ((2, 24), True),
    "ring_flash_attn_func": ((1, 24), False),
    "ring_flash_attn_varlen_func": ([0, 10, 24, 32], True),
    "zigzag_ring_flash_attn_varlen_qkvpacked_func": ([0, 12, 20, 32], True),
    "llama3_flash_attn_varlen_func": ([0, 13, 27, 32], True),
}


class Model(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.wk = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = torch.nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids, attention):
        """ids [..., tokens] -> logits; attention(q, k, v) on [..., tokens, heads, HEAD_DIM]."""
        x = self.embed(ids)
        q = self.wq(x).unflatten(-1, (HEADS, HEAD_DIM))
        k = self.wk(x).unflatten(-1, (KV_HEADS, HEAD_DIM))
        v = self.wv(x).unflatten(-1, (KV_HEADS, HEAD_DIM))
        x = x + self.wo(attention(q, k, v).flatten(-2))
        return self.head(x)


def data(name):
    shape, _ = EXPERIMENTS[name]
    gen = torch.Generator().manual_seed(len(name))
    tokens = (shape[0], shape[1]) if isinstance(shape, tuple) else (shape[-1],)
    return torch.randint(0, VOCAB, tokens, generator=gen), torch.randint(0, VOCAB, tokens,
                                                                         generator=gen)


# -- each rank's shard, as ring-flash-attn's tests cut it (dim: the token dim) ----------------

def local_batch(value, kind, rank, world, dim=1):
    if kind == "zigzag":
        chunks = value.chunk(2 * world, dim=dim)
        return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)
    if kind == "stripe":  # token t to rank t % world
        value = torch.stack(value.split(world, dim=dim), dim=dim).transpose(dim, dim + 1)
        return value.select(dim, rank)
    return value.chunk(world, dim=dim)[rank]


def local_varlen(value, cu, kind, rank, world):
    parts = []
    for start, end in zip(cu[:-1], cu[1:]):
        if kind == "zigzag":
            chunks = value[start:end].chunk(2 * world, dim=0)
            parts += [chunks[rank], chunks[2 * world - 1 - rank]]
        else:
            parts.append(value[start:end].chunk(world, dim=0)[rank])
    return torch.cat(parts, dim=0)


def shard(name, value, rank, world):
    shape, _ = EXPERIMENTS[name]
    if name.startswith("llama3"):
        n = value.shape[0] // world
        return value[rank * n:(rank + 1) * n]
    kind = "zigzag" if name.startswith("zigzag") else "stripe" if name.startswith("stripe") else ""
    if isinstance(shape, tuple):
        return local_batch(value, kind, rank, world)
    return local_varlen(value, shape, kind, rank, world)


def ring_attention(name, group, rank, world):
    """The ring-flash-attn call of an experiment, on this rank's q, k, v."""
    shape, causal = EXPERIMENTS[name]
    if isinstance(shape, tuple):
        fn = {"zigzag_ring_flash_attn_func": zigzag_ring_flash_attn_func,
              "stripe_flash_attn_func": stripe_flash_attn_func,
              "ring_flash_attn_func": ring_flash_attn_func}[name]
        return lambda q, k, v: fn(q, k, v, causal=causal, group=group)
    cu = torch.tensor(shape, dtype=torch.int32)
    if name.startswith("llama3"):
        cu_q, cu_k, max_q, max_k, local_k_slice = llama3_flash_attn_prepare_cu_seqlens(
            cu, causal=causal, rank=rank, world_size=world)
        return lambda q, k, v: llama3_flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, heads_k_stride=1, local_k_slice=local_k_slice,
            causal=causal, group=group)
    local_cu = cu // world
    local_max = int((local_cu[1:] - local_cu[:-1]).max())
    if name == "ring_flash_attn_varlen_func":
        return lambda q, k, v: ring_flash_attn_varlen_func(q, k, v, local_cu, local_max,
                                                           causal=causal, group=group)

    def packed(q, k, v):  # qkv [T, 3, H, D]: kv heads repeated to the query heads
        rep = HEADS // KV_HEADS
        qkv = torch.stack([q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)], dim=1)
        return zigzag_ring_flash_attn_varlen_qkvpacked_func(qkv, local_cu, local_max,
                                                            causal=causal, group=group)
    return packed


def train(name, group=None):
    """STEPS steps on this rank's shard; the losses and the first step's summed gradients."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ids, targets = data(name)
    ids, targets = shard(name, ids, rank, world), shard(name, targets, rank, world)
    model = Model(seed=1)
    attention = ring_attention(name, group, rank, world)
    losses, grads = [], None
    for _ in range(STEPS):
        logits = model(ids, attention)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                               reduction="sum") / (targets.numel() * world)
        model.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item())
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
                p -= LR * p.grad
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads}


def reference(name):
    """The same training on one process in float64, attention by torch's SDPA."""
    shape, causal = EXPERIMENTS[name]
    ids, targets = data(name)
    cu = list(shape) if not isinstance(shape, tuple) else [i * shape[1]
                                                           for i in range(shape[0] + 1)]
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.tensor(cu).diff())
    pos = torch.arange(cu[-1])
    mask = seq[:, None] == seq[None, :]
    if causal:
        mask &= pos[:, None] >= pos[None, :]

    def attention(q, k, v):  # [T, h, d] (the batch rows flattened)
        shp = q.shape
        q, k, v = (t.reshape(-1, t.shape[-2], HEAD_DIM).transpose(0, 1) for t in (q, k, v))
        k, v = (t.repeat_interleave(HEADS // KV_HEADS, 0) for t in (k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return o.transpose(0, 1).reshape(shp[:-2] + (HEADS, HEAD_DIM))

    model = Model(seed=1).double()
    losses, grads = [], None
    for _ in range(STEPS):
        logits = model(ids, attention)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1),
                               reduction="sum") / targets.numel()
        model.zero_grad()
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads}


def main(out):
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    results = {name: train(name) for name in EXPERIMENTS}
    if dist.get_rank() == 0:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
    dist.destroy_process_group()
