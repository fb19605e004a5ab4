"""ringattn for PyTorch: differentiable attention on local shards, as torch.library custom ops.

    out, lse = ringattn.torch.attention(q, k, v, cu_seqlens, causal=True, comm=comm)

q [T_local, H, D], k and v [T_local_k, H_kv, D or D_v]: packed variable-length sequences with
no batch dimension (the layout of FlashAttention's varlen functions), each with a contiguous
last dim. cu_seqlens are the GLOBAL packed batch's boundaries, the same on every rank; with a
comm (a ringattn.Comm: a ring; a ringattn.Grid: 2D context parallelism, Ulysses inside groups
and the ring across them) every rank passes its own rows under `layout` (plan() and shard()
give them, positions() their positions for RoPE). Returns out [T_local, H, D_v] and lse
[H, T_local] float32 (SPEC 4).

The ops "ringattn::forward" and "ringattn::backward" have fake kernels (torch.compile traces
them without graph breaks) and autograd (the backward is the library's deterministic SPEC 7
backward). Plans are made on first use and cached by shapes, dtype, device, mask and comm; on
a comm, plan creation and every call are collective: every rank makes the same calls in the
same order. CPU tensors run on the CPU backend; CUDA tensors on the CUDA backend (a build with
CUDA), enqueued on the current stream. Both out and lse are differentiable (a loss may use lse,
e.g. to merge with other attention terms: its gradient reaches the library's backward as dlse,
SPEC 11). Attention sinks (gpt-oss): sinks=[H].
"""
import collections
import ctypes
import threading
from typing import List, Optional, Tuple

import torch

from . import _capi as C
from .core import Comm, Grid, Plan, _grid_of

__all__ = ["attention", "plan", "shard", "unshard", "positions", "ShardPlan", "clear_cache"]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_LAYOUTS = ("contiguous", "zigzag", "striped")

_cache_lock = threading.Lock()
_plans = collections.OrderedDict()
_PLAN_CACHE_SIZE = 64


def _comm_id(comm, ulysses_size=0, ulysses_strided=False):
    """Ops take a comm as an int (their schema has no room for objects): the id it was
    registered under when made (Comm.id, Grid.id), which a torch.compile trace reads as a
    constant. ulysses_size > 1 with a Comm: its grid (Comm.grid), the library splitting it."""
    if comm is not None and not isinstance(comm, (Comm, Grid)):
        raise _bad("comm must be a ringattn.Comm or Grid, got %r" % (comm,))
    comm = _grid_of(comm, ulysses_size, ulysses_strided)
    return 0 if comm is None else comm.id


def _comm(cid):
    if cid == 0:
        return None
    comm = Comm.by_id(cid)
    if comm is None:
        raise C.UsageError(C.INVALID_USAGE, "ringattn: the op's comm (%d) no longer exists" % cid)
    return comm


def clear_cache():
    """Destroys the cached plans (each rank must clear at the same point of its calls)."""
    with _cache_lock:
        plans = list(_plans.values())
        _plans.clear()
    for p in plans:
        p.close()


def _bad(message):
    return C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn.torch: " + message)


def host_ints(t, what):
    """A 1-D int32/int64 tensor or a sequence of ints as a tuple on the host (None stays)."""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
            raise _bad("%s must be a 1-D int32 or int64 tensor, got %s of shape %s" %
                       (what, t.dtype, tuple(t.shape)))
        t = t.detach().cpu().tolist()
    return tuple(int(x) for x in t)


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise _bad("%s must be [tokens, heads, dim], got shape %s" % (name, tuple(t.shape)))
        if t.dtype not in _DTYPES:
            raise _bad("%s has dtype %s; ringattn takes float32, float16 or bfloat16" % (name, t.dtype))
        if t.shape[2] > 1 and t.stride(2) != 1:
            raise _bad("%s's last dim must be contiguous (its stride is %d)" % (name, t.stride(2)))
    if not (q.dtype == k.dtype == v.dtype):
        raise _bad("q, k and v must have one dtype, got %s, %s, %s" % (q.dtype, k.dtype, v.dtype))
    if not (q.device == k.device == v.device):
        raise _bad("q, k and v must be on one device, got %s, %s, %s" % (q.device, k.device, v.device))
    if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1]:
        raise _bad("k %s and v %s must have the same tokens and heads" % (tuple(k.shape), tuple(v.shape)))


def _drop_empty_tail(cu, cu_k):
    """cu_seqlens (and cu_seqlens_k) without their trailing sequences empty in both, which
    change nothing. Boundaries that ringattn.hf finds under torch.compile come as one entry a
    token (a traced shape cannot depend on values), the unused ones repeating the total: the
    plan would carry an empty sequence for each, and their host copy would cost per call."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.shape[0] < 3 or (
            cu_k is not None and not (isinstance(cu_k, torch.Tensor) and cu_k.shape == cu.shape)):
        return cu, cu_k
    keep = 2
    for t in (cu,) if cu_k is None else (cu, cu_k):
        differ = torch.nonzero(t != t[-1])  # the last entry before the tail's run
        keep = max(keep, int(differ[-1]) + 2 if differ.numel() else 2)
    return cu[:keep], None if cu_k is None else cu_k[:keep]


def _get_plan(q, k, v, cu_seqlens, cu_seqlens_k, alibi_slopes, key_bias, causal, window_left,
              window_right, softcap, scale, keep_k, layout, comm_id):
    _check_inputs(q, k, v)
    cu_seqlens, cu_seqlens_k = _drop_empty_tail(cu_seqlens, cu_seqlens_k)
    cu = host_ints(cu_seqlens, "cu_seqlens")
    cu_k = host_ints(cu_seqlens_k, "cu_seqlens_k")
    slopes = (None if alibi_slopes is None
              else tuple(float(x) for x in alibi_slopes.detach().float().cpu().reshape(-1)))
    bias_heads = 0 if key_bias is None else int(key_bias.shape[0])
    if not 0 <= layout < len(_LAYOUTS):
        raise _bad("layout must be one of %s" % (_LAYOUTS,))
    device = q.device
    if device.type not in ("cpu", "cuda"):
        raise _bad("tensors on %s: ringattn runs on the CPU and on CUDA devices" % device)
    key = (comm_id, str(device), q.dtype, q.shape[1], k.shape[1], q.shape[2], v.shape[2], cu, cu_k,
           slopes, bias_heads, bool(causal), window_left, window_right, float(softcap),
           float(scale), keep_k, layout)
    with _cache_lock:
        plan = _plans.get(key)
        if plan is not None and not plan._handle:  # closed with its comm
            del _plans[key]
            plan = None
        if plan is not None:
            _plans.move_to_end(key)
    if plan is None:
        cuda = device.type == "cuda"
        plan = Plan(cu, q.shape[1], q.shape[2], num_kv_heads=k.shape[1], head_dim_v=v.shape[2],
                    dtype=_DTYPES[q.dtype], layout=_LAYOUTS[layout], cu_seqlens_k=cu_k,
                    causal=causal, window=(window_left, window_right), scale=scale,
                    softcap=softcap, alibi_slopes=slopes, key_bias_heads=bias_heads,
                    keep_k=keep_k, backend="cuda" if cuda else "cpu",
                    device=(device.index if device.index is not None else
                            torch.cuda.current_device()) if cuda else -1,
                    comm=_comm(comm_id))
        with _cache_lock:
            _plans[key] = plan
            while len(_plans) > _PLAN_CACHE_SIZE:
                _plans.popitem(last=False)[1].close()
    want = plan.shapes
    for name, t in (("q", q), ("k", k), ("v", v)):
        if tuple(t.shape) != want[name]:
            raise _bad("%s has shape %s; this rank's plan for cu_seqlens %s holds %s" %
                       (name, tuple(t.shape), list(cu), want[name]))
    if key_bias is not None:
        if (key_bias.dtype != torch.float32 or tuple(key_bias.shape) != want["key_bias"] or
                not key_bias.is_contiguous() or key_bias.device != device):
            raise _bad("key_bias must be a contiguous float32 tensor of shape %s on %s" %
                       (want["key_bias"], device))
    return plan


def _t(x):
    return C.Tensor(x.data_ptr(), x.stride(0), x.stride(1))


def _readable(t):
    """t as the C API reads it: there a stride of 0 means packed, never a broadcast, so a view
    that repeats rows or heads (expand, or autograd's gradient of a sum) is copied first."""
    if any(t.stride(i) == 0 and t.shape[i] > 1 for i in range(t.dim())):
        return t.contiguous()
    return t


def _stream(t):
    return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream) if t.is_cuda else None


@torch.library.custom_op("ringattn::forward", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
             cu_seqlens_k: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
             key_bias: Optional[torch.Tensor], causal: bool, window_left: int, window_right: int,
             softcap: float, scale: float, keep_k: int, layout: int, comm_id: int,
             sinks: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    plan = _get_plan(q, k, v, cu_seqlens, cu_seqlens_k, alibi_slopes, key_bias, causal,
                     window_left, window_right, softcap, scale, keep_k, layout, comm_id)
    q, k, v = _readable(q), _readable(k), _readable(v)
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    t = C.Tensors(q=_t(q), k=_t(k), v=_t(v), o=_t(out), lse=lse.data_ptr())
    if key_bias is not None:
        t.key_bias = key_bias.data_ptr()
    if sinks is not None:
        t.sinks = _check_sinks(sinks, q).data_ptr()
    plan.forward_raw(t, _stream(q))
    return out, lse


def _check_sinks(sinks, q):
    """SPEC 11's sinks: [H] float32 on q's device (attention() casts them), contiguous."""
    if (sinks.dtype != torch.float32 or tuple(sinks.shape) != (q.shape[1],) or
            sinks.device != q.device):
        raise _bad("sinks must be a float32 tensor of shape (%d,) on %s, got %s %s on %s" %
                   (q.shape[1], q.device, sinks.dtype, tuple(sinks.shape), sinks.device))
    return sinks.contiguous()


@_forward.register_fake
def _forward_fake(q, k, v, cu_seqlens, cu_seqlens_k, alibi_slopes, key_bias, causal,
                  window_left, window_right, softcap, scale, keep_k, layout, comm_id, sinks=None):
    _check_inputs(q, k, v)
    return (q.new_empty((q.shape[0], q.shape[1], v.shape[2])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.custom_op("ringattn::backward", mutates_args=())
def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor,
              cu_seqlens_k: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
              key_bias: Optional[torch.Tensor], causal: bool, window_left: int,
              window_right: int, softcap: float, scale: float, keep_k: int, layout: int,
              comm_id: int, want_dbias: bool, sinks: Optional[torch.Tensor] = None,
              dlse: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    plan = _get_plan(q, k, v, cu_seqlens, cu_seqlens_k, alibi_slopes, key_bias, causal,
                     window_left, window_right, softcap, scale, keep_k, layout, comm_id)
    if dout.shape[2] > 1 and dout.stride(2) != 1:
        dout = dout.contiguous()  # autograd's gradients may come in any layout
    q, k, v, out, dout = (_readable(x) for x in (q, k, v, out, dout))
    lse = lse.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    t = C.Tensors(q=_t(q), k=_t(k), v=_t(v), o=_t(out), lse=lse.data_ptr(), dout=_t(dout),
                  dq=_t(dq), dk=_t(dk), dv=_t(dv))
    dbias = q.new_empty((0,), dtype=torch.float32)
    if key_bias is not None:
        t.key_bias = key_bias.data_ptr()
        if want_dbias:
            dbias = torch.empty_like(key_bias)
            t.dbias = dbias.data_ptr()
    dsinks = q.new_empty((0,), dtype=torch.float32)
    if sinks is not None:  # SPEC 11: this rank's part of the sinks' gradient
        sinks = _check_sinks(sinks, q)
        dsinks = torch.empty_like(sinks)
        t.sinks, t.dsinks = sinks.data_ptr(), dsinks.data_ptr()
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
        t.dlse = dlse.data_ptr()
    plan.backward_raw(t, _stream(q))
    return [dq, dk, dv, dbias, dsinks]


@_backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens_k, alibi_slopes, key_bias,
                   causal, window_left, window_right, softcap, scale, keep_k, layout, comm_id,
                   want_dbias, sinks=None, dlse=None):
    dbias = (torch.empty_like(key_bias) if key_bias is not None and want_dbias
             else q.new_empty((0,), dtype=torch.float32))
    dsinks = (torch.empty_like(sinks) if sinks is not None
              else q.new_empty((0,), dtype=torch.float32))
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias, dsinks]


_MASK_ARGS = ("cu_seqlens", "cu_seqlens_k", "alibi_slopes", "key_bias", "causal", "window_left",
              "window_right", "softcap", "scale", "keep_k", "layout", "comm_id")


_SINKS = 3 + len(_MASK_ARGS)  # the forward's last input


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.mask = inputs[3:_SINKS]
    ctx.want_dbias = inputs[6] is not None and ctx.needs_input_grad[6]
    ctx.save_for_backward(q, k, v, out, lse, inputs[_SINKS])
    ctx.set_materialize_grads(False)


def _autograd_backward(ctx, dout, dlse):
    """SPEC 7 and 11: lse is differentiable too (its gradient dlse enters as D_i - dlse_i)."""
    q, k, v, out, lse, sinks = ctx.saved_tensors
    grads = [None] * (_SINKS + 1)
    if dout is None and dlse is None:
        return tuple(grads)
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dbias, dsinks = _backward(dout, q, k, v, out, lse, *ctx.mask, ctx.want_dbias,
                                          sinks, dlse)
    grads[:3] = dq, dk, dv
    if ctx.want_dbias:
        grads[6] = dbias
    if sinks is not None and ctx.needs_input_grad[_SINKS]:
        grads[_SINKS] = dsinks
    return tuple(grads)


torch.library.register_autograd("ringattn::forward", _autograd_backward,
                                setup_context=_setup_context)


def attention(q, k, v, cu_seqlens, *, cu_seqlens_k=None, causal=False, window=(-1, -1),
              softcap=0.0, alibi_slopes=None, scale=None, key_bias=None, keep_k=0,
              layout="contiguous", comm=None, sinks=None, ulysses_size=0, ulysses_strided=False):
    """Attention of this rank's queries over every key of their sequences (module docstring).

    comm: None (one rank), a ringattn.Comm (a ring) or a ringattn.Grid (2D context parallelism:
    Ulysses all-to-all inside groups, the ring across them); ulysses_size=P_u with a Comm that
    the library can split (threads, MPI) is its Grid (comm.grid(P_u, ulysses_strided)). Each
    rank's rows are then the 2D plan's (plan(cu_seqlens, layout=..., comm=...) gives them).
    window = (left, right) keys before and after each query's position, -1 unbounded (causal
    sets right = 0); softcap 0 is off; scale None is 1/sqrt(D); key_bias [heads, T_local_k]
    float32 (SPEC 6's dynamic mask bias, differentiable) with keep_k its top-k selection;
    sinks [heads] (SPEC 11: gpt-oss's attention sinks, one logit a head joining every row's
    softmax as a key of value 0; differentiable, any float dtype, computed in float32; in a
    ring each rank's gradient is its rows' part, summed over the ranks as for every replicated
    parameter). out and lse are both differentiable.
    """
    if layout not in _LAYOUTS:
        raise _bad("layout must be one of %s, got %r" % (_LAYOUTS, layout))
    if not isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = torch.tensor(list(cu_seqlens), dtype=torch.int32)
    if cu_seqlens_k is not None and not isinstance(cu_seqlens_k, torch.Tensor):
        cu_seqlens_k = torch.tensor(list(cu_seqlens_k), dtype=torch.int32)
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = torch.tensor(list(alibi_slopes), dtype=torch.float32)
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if sinks is not None:
        sinks = sinks.to(torch.float32)  # differentiable: the gradient comes back in its dtype
    return _forward(q, k, v, cu_seqlens, cu_seqlens_k, alibi_slopes, key_bias, bool(causal),
                    left, right, float(softcap), 0.0 if scale is None else float(scale),
                    int(keep_k), _LAYOUTS.index(layout),
                    _comm_id(comm, ulysses_size, ulysses_strided), sinks)


class ShardPlan:
    """Which rows of a global packed batch this rank holds under a layout (SPEC 8), or on a 2D
    grid (ringattn.Grid): the plan's own local tokens (ringattn_plan_local_tokens)."""

    def __init__(self, cu_seqlens, layout, comm, ulysses_size=0, ulysses_strided=False):
        cu = host_ints(cu_seqlens, "cu_seqlens")
        comm = _grid_of(comm, ulysses_size, ulysses_strided)
        # collective; the token map is all we keep (a grid's plan needs H % P_u == 0)
        heads = comm.ulysses_size if isinstance(comm, Grid) else 1
        p = Plan(cu, heads, 1, num_kv_heads=1, layout=layout, comm=comm)
        self.cu_seqlens, self.layout, self.comm = cu, layout, comm
        self.num_tokens = p.num_tokens
        self.index = torch.from_numpy(p.local_tokens().astype("int64"))
        self.positions = torch.from_numpy(p.positions())
        p.close()

    def __repr__(self):
        return "ShardPlan(%d of %d tokens, layout=%s)" % (self.index.numel(), self.num_tokens,
                                                           self.layout)


def plan(cu_seqlens, *, layout="contiguous", comm=None, ulysses_size=0, ulysses_strided=False):
    """This rank's token layout for a global batch (collective over comm; comm, ulysses_size
    as attention's)."""
    return ShardPlan(cu_seqlens, layout, comm, ulysses_size, ulysses_strided)


def shard(x, plan, dim=0):
    """This rank's rows (along dim) of a global tensor, in local row order; differentiable."""
    if x.shape[dim] != plan.num_tokens:
        raise _bad("shard: dim %d has %d rows, the batch %d" % (dim, x.shape[dim], plan.num_tokens))
    return x.index_select(dim, plan.index.to(x.device))


def unshard(x, plan, dim=0):
    """A global tensor with this rank's rows in their places and zeros elsewhere; summed over
    the ranks (an all-reduce) it is the whole tensor. Differentiable."""
    if x.shape[dim] != plan.index.numel():
        raise _bad("unshard: dim %d has %d rows, this rank holds %d" %
                   (dim, x.shape[dim], plan.index.numel()))
    shape = list(x.shape)
    shape[dim] = plan.num_tokens
    return x.new_zeros(shape).index_copy(dim, plan.index.to(x.device), x)


def positions(plan):
    """Each local row's position within its own sequence (LongTensor), for RoPE."""
    return plan.positions.clone()
