"""ring-flash-attn's entry points (github zhuzilin/ring-flash-attention) over ringattn.

A script written for ring-flash-attn runs on ringattn by changing its import:

    from ringattn.ring_flash_attn import zigzag_ring_flash_attn_func, ...

The same names, positional arguments, defaults and LOCAL shards as ring-flash-attn (its
ring_flash_attn/__init__.py; the conventions below are those of its tests' extract_local):
- batched q/k/v [B, S_local, H, D], each rank S_local tokens of each of the B sequences:
  ring_flash_attn_* -- the r-th of P equal chunks; zigzag_ring_flash_attn_* -- chunks r and
  2P-1-r of 2P, in that order; stripe_flash_attn_* -- tokens r, r + P, r + 2P, ...
  These are ringattn's layouts contiguous, zigzag and striped (SPEC 8).
- varlen q/k/v [T_local, H, D] with cu_seqlens the LOCAL boundaries, the global ones divided by
  P (every sequence's length a multiple of P, of 2P for zigzag: each rank holds the same share
  of each sequence); max_seqlen the local one. The global boundaries are cu_seqlens * P.
- llama3_flash_attn_varlen_func: the packed stream split into P equal contiguous pieces (a
  sequence may span ranks); llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, causal, rank,
  world_size) gives each rank's (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  local_k_slice): keys all-gathered, local_k_slice their rows from each local sequence's start.
- group None is the default process group; return_attn_probs gives (out, lse, None) with lse
  [B, H, S_local] (batched) or [H, T_local] (varlen, flash-attn >= 2.6's layout).
- substitute_hf_flash_attn(process_group, heads_k_stride) / update_ring_flash_attn_params(
  cu_seqlens, process_group) / use_ring_attn(flag): the Hugging Face adapter (transformers 5's
  AttentionInterface), the llama3 layout (below).

Where ringattn differs (its results are the exact attention of the global batch, SPEC 9):
- windows: ring-flash-attn hands window_size unchanged to flash-attn on every ring step, so it
  is measured from the local block instead of the global positions (README: "window_size is not
  supported"); ringattn's windows are exact on every layout and in llama3 and the HF adapter.
- zigzag and stripe need causal=True there (assertions); here every mask runs on every layout.
- alibi_slopes are asserted None there; here ALiBi is exact ([H] slopes, or equal [B, H] rows).
- softcap: a keyword-only extension here (softcap=0.0), exact in every form.
- dropout_p must be 0 (ring-flash-attn passes it per step without replaying the mask).
- the backward is ringattn's deterministic one, returning the inputs' dtype (some
  ring-flash-attn versions return dq in bfloat16 whatever the inputs).
- llama3: non-causal calls and windows use each sequence's true query positions (flash-attn
  would align queries to the last key of a sequence that continues on the next rank);
  heads_k_stride is checked (it must divide H_kv) but every head is gathered at once.
- stripe varlen forms (stripe_flash_attn_varlen_*, on a ring-flash-attn branch) are here too.
"""
import bisect

import torch
import torch.distributed as dist

from . import torch as rt
from ._ring_flash_hf import (DATA_PARAMS, HF_NAME, substitute_hf_flash_attn,
                             update_ring_flash_attn_params, use_ring_attn)
from .flash_attn import (attend_batched, attend_varlen, check_max, group_comm, options, unpack)

__all__ = []  # filled below with every ring-flash-attn name


def _ring_comm(group, device):
    # ring-flash-attn's group None is the default group (its RingComm calls dist.get_rank(None))
    if isinstance(group, (tuple, list)) or getattr(group, "ndim", 1) != 1:
        # its local shards are the flat ring's: a 2D grid holds other rows (ringattn.flash_attn)
        raise NotImplementedError("ringattn.ring_flash_attn: group must be one process group "
                                  "(a flat ring); for 2D context parallelism use "
                                  "ringattn.flash_attn's functions with group=(ulysses_group, "
                                  "ring_group) or a DeviceMesh")
    return group_comm(dist.group.WORLD if group is None else group, device)


def _batched(layout, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
             return_attn_probs, group, softcap):
    comm = _ring_comm(group, q.device)
    opts = options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   q.shape[-2], layout, comm)
    return attend_batched(q, k, v, opts, comm, return_attn_probs)


def _varlen(layout, q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal,
            window_size, alibi_slopes, return_attn_probs, group, softcap):
    comm = _ring_comm(group, q.device)
    local = rt.host_ints(cu_seqlens, "cu_seqlens")
    check_max("max_seqlen", max_seqlen, local)
    # every rank holds 1/P of each sequence: the global boundaries are the local ones times P
    cu = [c * (1 if comm is None else comm.size) for c in local]
    opts = options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   q.shape[-2], layout, comm)
    return attend_varlen(q, k, v, cu, cu, None, None, opts, comm, return_attn_probs)


def _entry_points(prefix, layout):
    """The six functions of one ring-flash-attn family (func, kvpacked, qkvpacked and their
    varlen forms) with its exact signatures, for one ringattn layout."""

    def func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
             alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
             softcap=0.0):
        return _batched(layout, q, k, v, dropout_p, softmax_scale, causal, window_size,
                        alibi_slopes, return_attn_probs, group, softcap)

    def kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                      window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                      return_attn_probs=False, group=None, *, softcap=0.0):
        k, v = unpack("kv", kv, 5, 2)
        return _batched(layout, q, k, v, dropout_p, softmax_scale, causal, window_size,
                        alibi_slopes, return_attn_probs, group, softcap)

    def qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                       window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                       return_attn_probs=False, group=None, *, softcap=0.0):
        q, k, v = unpack("qkv", qkv, 5, 3)
        return _batched(layout, q, k, v, dropout_p, softmax_scale, causal, window_size,
                        alibi_slopes, return_attn_probs, group, softcap)

    def varlen_func(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                    causal=False, window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, group=None, *, softcap=0.0):
        return _varlen(layout, q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale,
                       causal, window_size, alibi_slopes, return_attn_probs, group, softcap)

    def varlen_kvpacked_func(q, kv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                             causal=False, window_size=(-1, -1), alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, group=None, *,
                             softcap=0.0):
        k, v = unpack("kv", kv, 4, 2)
        return _varlen(layout, q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale,
                       causal, window_size, alibi_slopes, return_attn_probs, group, softcap)

    def varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                              causal=False, window_size=(-1, -1), alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, group=None, *,
                              softcap=0.0):
        q, k, v = unpack("qkv", qkv, 4, 3)
        return _varlen(layout, q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale,
                       causal, window_size, alibi_slopes, return_attn_probs, group, softcap)

    made = []
    for fn, kind, shape in (
            (func, "func", "q/k/v [B, S_local, H(_kv), D]"),
            (kvpacked_func, "kvpacked_func", "q [B, S_local, H, D], kv [B, S_local, 2, H_kv, D]"),
            (qkvpacked_func, "qkvpacked_func", "qkv [B, S_local, 3, H, D]"),
            (varlen_func, "varlen_func", "q/k/v [T_local, H(_kv), D], LOCAL cu_seqlens"),
            (varlen_kvpacked_func, "varlen_kvpacked_func",
             "q [T_local, H, D], kv [T_local, 2, H_kv, D], LOCAL cu_seqlens"),
            (varlen_qkvpacked_func, "varlen_qkvpacked_func",
             "qkv [T_local, 3, H, D], LOCAL cu_seqlens")):
        fn.__name__ = fn.__qualname__ = "%s_%s" % (prefix, kind)
        fn.__doc__ = ("ring-flash-attn's %s on ringattn's %s layout: %s (module docstring)."
                      % (fn.__name__, layout, shape))
        __all__.append(fn.__name__)
        made.append(fn)
    return made


(ring_flash_attn_func, ring_flash_attn_kvpacked_func, ring_flash_attn_qkvpacked_func,
 ring_flash_attn_varlen_func, ring_flash_attn_varlen_kvpacked_func,
 ring_flash_attn_varlen_qkvpacked_func) = _entry_points("ring_flash_attn", "contiguous")
(zigzag_ring_flash_attn_func, zigzag_ring_flash_attn_kvpacked_func,
 zigzag_ring_flash_attn_qkvpacked_func, zigzag_ring_flash_attn_varlen_func,
 zigzag_ring_flash_attn_varlen_kvpacked_func,
 zigzag_ring_flash_attn_varlen_qkvpacked_func) = _entry_points("zigzag_ring_flash_attn", "zigzag")
(stripe_flash_attn_func, stripe_flash_attn_kvpacked_func, stripe_flash_attn_qkvpacked_func,
 stripe_flash_attn_varlen_func, stripe_flash_attn_varlen_kvpacked_func,
 stripe_flash_attn_varlen_qkvpacked_func) = _entry_points("stripe_flash_attn", "striped")


# ---------------------------------------------------------------------------------------------
# llama3: keys all-gathered, each rank attending its contiguous piece of the packed stream

def llama3_flash_attn_prepare_cu_seqlens(cu_seqlens, causal, rank, world_size):
    """This rank's (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice) for the
    global packed batch cu_seqlens split into world_size equal contiguous pieces: queries are the
    rank's piece, keys run from the start of its first sequence to the end of its piece (causal)
    or of its last sequence (not causal), as rows local_k_slice of the all-gathered keys."""
    cu = list(rt.host_ints(cu_seqlens, "cu_seqlens"))
    total = cu[-1]
    if total % world_size:
        raise ValueError("ringattn.ring_flash_attn: the packed batch's %d tokens do not split "
                         "into %d equal pieces" % (total, world_size))
    n = total // world_size
    lo, hi = rank * n, (rank + 1) * n
    left = bisect.bisect_left(cu, lo)
    if cu[left] != lo:  # lo falls inside a sequence: start from that sequence
        left -= 1
    right = bisect.bisect_left(cu, hi)
    bounds = cu[left:right + 1]
    cu_q = [0] + [b - lo for b in bounds[1:-1]] + [n]
    slice_left, slice_right = cu[left], hi if causal else cu[right]
    cu_k = [b - slice_left for b in bounds[:-1]] + [slice_right - slice_left]

    def as_tensor(values):
        if isinstance(cu_seqlens, torch.Tensor):
            return torch.tensor(values, dtype=cu_seqlens.dtype, device=cu_seqlens.device)
        return torch.tensor(values, dtype=torch.int32)

    longest = lambda c: max([b - a for a, b in zip(c[:-1], c[1:])] or [0])  # noqa: E731
    return (as_tensor(cu_q), as_tensor(cu_k), longest(cu_q), longest(cu_k),
            slice(slice_left, slice_right))


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0 over a group; the gradient is the reduce-scatter of the gathered
    rows' gradient (each rank's rows get the sum of what every rank's attention sent them)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty((dist.get_world_size(group) * x.shape[0],) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group),) +
                             tuple(grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad, group=ctx.group)
        return out, None


def _llama3(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
            local_k_slice, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
            return_attn_probs, group, softcap):
    group = dist.group.WORLD if group is None else group
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if not (isinstance(heads_k_stride, int) and heads_k_stride >= 1 and
            k.shape[1] % heads_k_stride == 0):
        raise ValueError("ringattn.ring_flash_attn: heads_k_stride %r must divide the %d kv heads"
                         % (heads_k_stride, k.shape[1]))
    cu_q = list(rt.host_ints(cu_seqlens_q, "cu_seqlens_q"))
    cu_k = list(rt.host_ints(cu_seqlens_k, "cu_seqlens_k"))
    check_max("max_seqlen_q", max_seqlen_q, cu_q)
    check_max("max_seqlen_k", max_seqlen_k, cu_k)
    start = local_k_slice.start or 0
    stop = local_k_slice.stop
    if (len(cu_q) != len(cu_k) or cu_q[-1] != q.shape[0] or local_k_slice.step not in (None, 1)
            or stop is None or not 0 <= start <= stop <= world * k.shape[0]
            or cu_k[-1] != stop - start):
        raise ValueError("ringattn.ring_flash_attn: cu_seqlens_q %s, cu_seqlens_k %s and "
                         "local_k_slice %s do not describe %d local queries over %d x %d keys "
                         "(llama3_flash_attn_prepare_cu_seqlens makes them)"
                         % (cu_q, cu_k, local_k_slice, q.shape[0], world, k.shape[0]))
    if world > 1:
        k, v = _GatherRows.apply(k, group), _GatherRows.apply(v, group)
    k, v = k[start:stop], v[start:stop]
    # Each local sequence's keys start at the sequence's start, so its first query sits `off`
    # tokens into them. ringattn aligns queries to the last key (SPEC 2's delta = L_k - L_q):
    # where that is not the true position (keys running past the queries, as the non-causal
    # prepare gives), zero query rows appended to the sequence make it so; they are dropped after.
    q_first = rank * q.shape[0]
    pads = []
    for i in range(len(cu_q) - 1):
        lq, lk = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        off = q_first + cu_q[i] - (start + cu_k[i])
        if lq and (off < 0 or off + lq > lk):
            raise ValueError("ringattn.ring_flash_attn: local sequence %d's %d queries at %d are "
                             "not within its %d keys" % (i, lq, off, lk))
        pads.append(lk - off - lq if lq else 0)
    opts = options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   q.shape[-2], "contiguous", None)
    if any(pads):
        padded, rows = [0], []
        for i, pad in enumerate(pads):
            rows.extend(range(padded[-1], padded[-1] + cu_q[i + 1] - cu_q[i]))
            padded.append(padded[-1] + cu_q[i + 1] - cu_q[i] + pad)
        rows = torch.tensor(rows, dtype=torch.long, device=q.device)
        qp = q.new_zeros((padded[-1],) + tuple(q.shape[1:])).index_copy(0, rows, q)
        out, lse = rt.attention(qp, k, v, padded, cu_seqlens_k=cu_k, **opts)
        out, lse = out.index_select(0, rows), lse.index_select(1, rows)
    else:
        out, lse = rt.attention(q, k, v, cu_q, cu_seqlens_k=None if cu_k == cu_q else cu_k,
                                **opts)
    return (out, lse, None) if return_attn_probs else out


def llama3_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, heads_k_stride, local_k_slice, dropout_p=0.0,
                                  softmax_scale=None, causal=False, window_size=(-1, -1),
                                  alibi_slopes=None, deterministic=False,
                                  return_attn_probs=False, group=None, *, softcap=0.0):
    """ring-flash-attn's llama3 context parallelism: q/k/v [T_local, H(_kv), D], this rank's
    contiguous piece of the packed stream, with llama3_flash_attn_prepare_cu_seqlens's values."""
    return _llama3(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   heads_k_stride, local_k_slice, dropout_p, softmax_scale, causal, window_size,
                   alibi_slopes, return_attn_probs, group, softcap)


def llama3_flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k, heads_k_stride, local_k_slice,
                                           dropout_p=0.0, softmax_scale=None, causal=False,
                                           window_size=(-1, -1), alibi_slopes=None,
                                           deterministic=False, return_attn_probs=False,
                                           group=None, *, softcap=0.0):
    """llama3_flash_attn_varlen_func with kv [T_local, 2, H_kv, D]."""
    k, v = unpack("kv", kv, 4, 2)
    return _llama3(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   heads_k_stride, local_k_slice, dropout_p, softmax_scale, causal, window_size,
                   alibi_slopes, return_attn_probs, group, softcap)


def llama3_flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, heads_k_stride, local_k_slice,
                                            dropout_p=0.0, softmax_scale=None, causal=False,
                                            window_size=(-1, -1), alibi_slopes=None,
                                            deterministic=False, return_attn_probs=False,
                                            group=None, *, softcap=0.0):
    """llama3_flash_attn_varlen_func with qkv [T_local, 3, H, D]."""
    q, k, v = unpack("qkv", qkv, 4, 3)
    return _llama3(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   heads_k_stride, local_k_slice, dropout_p, softmax_scale, causal, window_size,
                   alibi_slopes, return_attn_probs, group, softcap)


__all__ += ["llama3_flash_attn_prepare_cu_seqlens", "llama3_flash_attn_varlen_func",
            "llama3_flash_attn_varlen_kvpacked_func", "llama3_flash_attn_varlen_qkvpacked_func",
            "substitute_hf_flash_attn", "update_ring_flash_attn_params", "use_ring_attn",
            "HF_NAME", "DATA_PARAMS"]
