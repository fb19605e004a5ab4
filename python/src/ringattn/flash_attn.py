"""flash-attn 2's functions over ringattn, on one rank or in a ring over a torch.distributed group.

    from ringattn import flash_attn_func, flash_attn_varlen_func
    out = flash_attn_func(q, k, v, causal=True)                               # q [B, S, H, D]
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                         return_attn_probs=True)              # q [T, H, D]

The names, argument order, defaults and return values are flash-attn 2's (flash_attn_interface,
2.6 and later: softcap before alibi_slopes; varlen lse [H, total_q], batched lse [B, H, S_q]):
flash_attn_func, flash_attn_varlen_func and their qkvpacked / kvpacked forms. What ringattn
adds is keyword-only: group= and layout= ("contiguous", "zigzag" or "striped", SPEC 8). group:
- None: one rank, as in flash-attn;
- a torch.distributed process group (or a 1-D DeviceMesh): a ring over its ranks;
- a pair (ulysses_group, ring_group) of process groups: 2D context parallelism (ringattn.Grid):
  an all-to-all (Ulysses) inside ulysses_group, this rank's group of P_u ranks, and the ring
  over ring_group, the P_r ranks at this rank's place in every group (rank g of ring_group is
  group g). Every rank passes its own two groups (torch.distributed.new_group for each);
- a 2-D torch.distributed.device_mesh.DeviceMesh: that pair, its groups taken by name when its
  mesh_dim_names hold "ring" and "ulysses" (or "cp_ring" and "cp_ulysses"), in any order, else
  by position: dim 0 the ring across groups, dim 1 Ulysses inside a group, so that
  init_device_mesh(device, (P_r, P_u)) makes groups of P_u consecutive ranks (a node's GPUs).
The library cannot split a torch.distributed comm itself (ringattn.Comm.grid is for threads and
MPI comms): a 2D run over torch.distributed is given its two groups.

In a ring every rank passes its own shard:
- batched [B, S_local, H, D]: rank r holds its S_local tokens of each of the B sequences, in the
  layout's order, every rank the same S_local (the global length is S = P * S_local):
  contiguous -- tokens r*S_local .. (r+1)*S_local - 1; zigzag -- of 2P equal chunks, chunks r
  and 2P-1-r, in that order; striped -- tokens r, r + P, r + 2P, ... (for odd S_local under
  zigzag the 2P chunks are SPEC 8's: the first P one token longer).
- varlen [T_local, H, D]: the concatenation of its pieces of every sequence (ringattn.torch.plan
  and shard() give them); cu_seqlens_q are the GLOBAL batch's boundaries, the same on every rank,
  and cu_seqlens_k must equal them (ring attention attends a token set to itself).
On a 2D group the layout splits each sequence among the P_r groups (as the list above, with P_r
and the group's place), and a group's rows, all its sequences' pieces in order, are split among
its P_u ranks in consecutive pieces: shard_plan(cu_seqlens, group=..., layout=...) gives each
rank's rows (its .index; ringattn.torch.shard / unshard cut and place them). Batched calls take
the same rows viewed as [B, S_local] (every rank the same number of rows), so for B > 1 a rank's
row block may span two sequences: the varlen form with the plan's rows is the plain one there.
ringattn.ring_flash_attn has ring-flash-attn's spellings instead (local cu_seqlens, group None
meaning the default group, flat rings only).

Semantics are SPEC's and flash-attn's: causal and windows bottom-right aligned when S_q != S_k,
window (left, right) with -1 unbounded (causal sets right = 0), softcap c > 0 gives
c * tanh(scale * q.k / c), ALiBi subtracts slope * |i + S_k - S_q - j|, a row with no allowed key
gives out 0 and lse -inf. The backward is ringattn's deterministic one whatever `deterministic`
says; softmax_lse is ringattn.torch.attention's, differentiable (SPEC 11's dlse), where
flash-attn's backward silently drops a gradient through it. Refused with a clear error: dropout_p != 0,
block_table (paged KV), ALiBi slopes that differ between batch rows, and in a ring S_q != S_k.
"""
import threading

import torch
import torch.distributed as dist

from . import _capi as C
from . import torch as rt
from .core import Comm, Grid

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]

LAYOUTS = ("contiguous", "zigzag", "striped")


def _bad(message):
    return C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn.flash_attn: " + message)


# ---------------------------------------------------------------------------------------------
# A Comm per process group: made on first use (collective over the group, like the attention
# call itself) and kept, so that the plans cached by ringattn.torch keep finding it.

_comm_lock = threading.Lock()
# (ids of the groups, device) -> (groups, Comm or Grid); the groups are held so ids stay unique
_group_comms = {}


def _is_mesh(group):
    return type(group).__name__ == "DeviceMesh" and hasattr(group, "get_group")


def mesh_groups(mesh):
    """A DeviceMesh's process groups for this rank: the group of a 1-D mesh, or of a 2-D one
    (ulysses_group, ring_group), by the names "ring"/"ulysses" or "cp_ring"/"cp_ulysses" where
    mesh_dim_names has them, else dim 0 the ring and dim 1 Ulysses (module docstring)."""
    if mesh.ndim == 1:
        return mesh.get_group(0)
    if mesh.ndim != 2:
        raise _bad("a DeviceMesh group must have 1 dim (a ring) or 2 (ring, ulysses), got %d"
                   % mesh.ndim)
    names = tuple(mesh.mesh_dim_names or ())
    for ring, ulysses in (("ring", "ulysses"), ("cp_ring", "cp_ulysses")):
        if ring in names and ulysses in names:
            return mesh.get_group(names.index(ulysses)), mesh.get_group(names.index(ring))
    return mesh.get_group(1), mesh.get_group(0)


def _groups(group):
    """group= as (ulysses_group, ring_group), or a single process group for a flat ring."""
    if _is_mesh(group):
        group = mesh_groups(group)
    if isinstance(group, (tuple, list)):
        if len(group) != 2 or any(g is None or _is_mesh(g) or isinstance(g, (tuple, list))
                                  for g in group):
            raise _bad("a 2D group is a pair (ulysses_group, ring_group) of process groups, "
                       "got %r" % (group,))
        return tuple(group)
    return group


def group_comm(group, device):
    """ringattn's Comm over a torch.distributed group for tensors on `device`, or None when the
    group has one rank (no ring to run); for a pair (ulysses_group, ring_group) or a 2-D
    DeviceMesh a ringattn.Grid over a comm of each group (module docstring). Made on first use
    (collective over the groups) and kept."""
    if not dist.is_available() or not dist.is_initialized():
        raise C.UsageError(C.INVALID_USAGE, "ringattn.flash_attn: group= needs "
                           "torch.distributed.init_process_group first")
    group = _groups(group)
    pair = isinstance(group, tuple)
    if pair and dist.get_world_size(group[0]) == 1:  # groups of one rank: a flat ring
        group, pair = group[1], False
    if not pair and dist.get_world_size(group) == 1:
        return None
    device = torch.device(device)
    held = group if pair else (group,)
    key = tuple(id(g) for g in held) + (device.type, device.index)
    with _comm_lock:
        entry = _group_comms.get(key)
    if (entry is not None and all(a is b for a, b in zip(entry[0], held)) and
            entry[1]._handle):
        return entry[1]
    # the tensors' device picks the transport: NCCL for CUDA, torch.distributed's p2p for CPU
    if pair:
        comm = Grid(Comm.from_torch(group[0], device), Comm.from_torch(group[1], device),
                    owned=True)
    else:
        comm = Comm.from_torch(group, device)
    with _comm_lock:
        _group_comms[key] = (held, comm)
    return comm


def shard_plan(cu_seqlens, *, group, layout="contiguous", device="cpu"):
    """Which rows of the global packed batch (cu_seqlens) this rank holds on `group` under
    `layout`: a ringattn.torch.ShardPlan (.index, .positions; ringattn.torch.shard / unshard).
    Collective over the group, as the attention calls are."""
    if layout not in LAYOUTS:
        raise _bad("layout must be one of %s, got %r" % (LAYOUTS, layout))
    comm = None if group is None else group_comm(group, device)
    return rt.plan(cu_seqlens, layout=layout if comm is not None else "contiguous", comm=comm)


# ---------------------------------------------------------------------------------------------
# flash-attn's arguments as ringattn.torch.attention's

def options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, num_heads,
            layout, comm):
    """flash-attn's arguments as ringattn.torch.attention's keywords (refusing what it lacks)."""
    if dropout_p is not None and float(dropout_p) != 0.0:
        raise NotImplementedError(
            "ringattn.flash_attn: dropout_p=%g: attention dropout is not supported (its random "
            "mask cannot be replayed exactly across ring steps); pass dropout_p=0.0 (in a model: "
            "attention_dropout=0 or model.eval())" % float(dropout_p))
    if layout not in LAYOUTS:
        raise _bad("layout must be one of %s, got %r" % (LAYOUTS, layout))
    try:
        left, right = (int(window_size[0]), int(window_size[1]))
    except (TypeError, ValueError, IndexError):
        raise _bad("window_size must be a pair (left, right), got %r" % (window_size,)) from None
    if left < -1 or right < -1:
        raise _bad("window_size entries are >= 0 or -1 (unbounded), got %r" % ((left, right),))
    if softmax_scale is not None and float(softmax_scale) == 0.0:
        # ringattn's descriptor reads a scale of 0 as "the default": refuse it rather than
        # silently give 1/sqrt(D)
        raise _bad("softmax_scale=0 is not supported (None is 1/sqrt(headdim))")
    softcap = float(softcap or 0.0)
    slopes = None
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes).detach().to(device="cpu", dtype=torch.float32)
        if slopes.dim() == 2:
            # flash-attn takes [B, H] slopes; ringattn's plan has one slope per head
            if not bool((slopes == slopes[:1]).all()):
                raise NotImplementedError("ringattn.flash_attn: alibi_slopes that differ between "
                                          "batch rows are not supported (one slope per head)")
            slopes = slopes[0]
        if slopes.dim() != 1 or slopes.numel() != num_heads:
            raise _bad("alibi_slopes must be [nheads] or [batch, nheads] with nheads = %d, got "
                       "shape %s" % (num_heads, tuple(torch.as_tensor(alibi_slopes).shape)))
    # one rank has no layout: its plan (and ringattn.torch's plan cache) is the contiguous one
    return dict(causal=bool(causal), window=(left, right), softcap=softcap if softcap > 0 else 0.0,
                alibi_slopes=slopes, scale=None if softmax_scale is None else float(softmax_scale),
                layout=layout if comm is not None else "contiguous")


def check_max(name, max_seqlen, cu):
    """flash-attn sizes its grid by max_seqlen and skips rows past it; ringattn does not need it,
    but a value below the longest sequence is a caller's bug worth naming."""
    if max_seqlen is None:
        return
    longest = max([b - a for a, b in zip(cu[:-1], cu[1:])] or [0])
    m = int(max_seqlen.item() if isinstance(max_seqlen, torch.Tensor) else max_seqlen)
    if m < longest:
        raise _bad("%s=%d is below the longest sequence of the cu_seqlens given (%d)"
                   % (name, m, longest))


def _dims(name, t, n):
    if not isinstance(t, torch.Tensor) or t.dim() != n:
        raise _bad("%s must be a %d-D tensor, got %s" % (
            name, n, tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__))


def _flat(t):
    """[B, S, h, d] as [B * S, h, d]: a view when B and S merge (qkv[:, :, 0] of a packed qkv
    does), else a copy; only the last dim must be contiguous either way."""
    return t.reshape(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])


def _result(out, lse, return_attn_probs):
    # flash-attn's third value is the dropout-encoded softmax, None without dropout
    return (out, lse, None) if return_attn_probs else out


def attend_batched(q, k, v, opts, comm, return_attn_probs):
    """q [B, S_q, H, D], k/v [B, S_k, H_kv, D(_v)] on one rank (comm None) or this rank's shards
    of B sequences of P * S_q tokens each in a ring."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _dims(name, t, 4)
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    if k.shape[0] != b or v.shape[0] != b or v.shape[1] != sk:
        raise _bad("q %s, k %s and v %s disagree on batch or sequence length"
                   % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    cu_k = None
    if comm is None:
        cu = [i * sq for i in range(b + 1)]
        if sk != sq:
            cu_k = [i * sk for i in range(b + 1)]
    else:
        if sk != sq:
            raise _bad("in a ring q and k/v are the same tokens' shards (S_q %d, S_k %d)"
                       % (sq, sk))
        seq = sq * comm.size
        cu = [i * seq for i in range(b + 1)]
    out, lse = rt.attention(_flat(q), _flat(k), _flat(v), cu, cu_seqlens_k=cu_k,
                            comm=comm, **opts)
    out = out.view(b, sq, h, out.shape[-1])
    # [H, B * S] -> flash-attn's [B, H, S]
    lse = lse.view(h, b, sq).transpose(0, 1).contiguous()
    return _result(out, lse, return_attn_probs)


def attend_varlen(q, k, v, cu_q, cu_k, max_q, max_k, opts, comm, return_attn_probs):
    """q [T_q, H, D], k/v [T_k, H_kv, D(_v)] packed by cu_q / cu_k (global ones in a ring)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _dims(name, t, 3)
    cu_q = rt.host_ints(cu_q, "cu_seqlens_q")
    cu_k = rt.host_ints(cu_k, "cu_seqlens_k") if cu_k is not None else cu_q
    check_max("max_seqlen_q", max_q, cu_q)
    check_max("max_seqlen_k", max_k, cu_k)
    if comm is not None and cu_k != cu_q:
        raise _bad("in a ring cu_seqlens_k must equal cu_seqlens_q (the global batch's "
                   "boundaries): ring attention attends a token set to itself")
    out, lse = rt.attention(q, k, v, cu_q, cu_seqlens_k=None if cu_k == cu_q else cu_k,
                            comm=comm, **opts)
    return _result(out, lse, return_attn_probs)


def _comm(group, device):
    return None if group is None else group_comm(group, device)



# ---------------------------------------------------------------------------------------------
# flash-attn 2's entry points

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, group=None, layout="contiguous"):
    """q [B, S_q, H, D], k/v [B, S_k, H_kv, D(_v)] -> out [B, S_q, H, D_v], or with
    return_attn_probs (out, softmax_lse [B, H, S_q] float32, None). group: a ring over the
    group's ranks, each passing its shard of every sequence under `layout`, or a 2D grid (a
    pair of groups, a DeviceMesh), each rank its plan's rows (module docstring)."""
    comm = _comm(group, q.device)
    opts = options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   q.shape[-2], layout, comm)
    return attend_batched(q, k, v, opts, comm, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, group=None,
                           layout="contiguous"):
    """q [total_q, H, D], k/v [total_k, H_kv, D(_v)] -> out [total_q, H, D_v], or with
    return_attn_probs (out, softmax_lse [H, total_q] float32, None). In a ring (group) q, k, v
    are this rank's rows and cu_seqlens_q = cu_seqlens_k the GLOBAL boundaries."""
    if block_table is not None:
        raise NotImplementedError("ringattn.flash_attn: block_table (a paged KV cache) is not "
                                  "supported; pass the keys packed by cu_seqlens_k")
    comm = _comm(group, q.device)
    opts = options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   q.shape[-2], layout, comm)
    return attend_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opts,
                         comm, return_attn_probs)


def unpack(name, t, dims, n):
    _dims(name, t, dims)
    if t.shape[-3] != n:
        raise _bad("%s must hold %d tensors in dim %d, got shape %s"
                   % (name, n, dims - 3, tuple(t.shape)))
    return [t.select(dims - 3, i) for i in range(n)]


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, group=None,
                              layout="contiguous"):
    """qkv [B, S, 3, H, D]: flash_attn_func on its three parts (gradients land in qkv)."""
    q, k, v = unpack("qkv", qkv, 5, 3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, group=group,
                           layout=layout)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, group=None,
                             layout="contiguous"):
    """q [B, S_q, H, D], kv [B, S_k, 2, H_kv, D]: flash_attn_func on q and kv's two parts."""
    k, v = unpack("kv", kv, 5, 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, group=group,
                           layout=layout)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, group=None, layout="contiguous"):
    """qkv [total, 3, H, D]: flash_attn_varlen_func with one cu_seqlens for queries and keys."""
    q, k, v = unpack("qkv", qkv, 4, 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs, group=group,
                                  layout=layout)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, group=None, layout="contiguous"):
    """q [total_q, H, D], kv [total_k, 2, H_kv, D]: flash_attn_varlen_func on kv's parts."""
    k, v = unpack("kv", kv, 4, 2)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  group=group, layout=layout)
