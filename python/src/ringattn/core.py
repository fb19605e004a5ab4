"""Communicators and plans over the C API, with numpy arrays in and out.

A Plan is ringattn_plan_t: the shapes and masks of a call, made once (collective over its comm)
and run many times. Tensors are [T, heads, dim] with any row and head strides and a contiguous
last dim (SPEC 8's local rows: plan.local_tokens()). The C API cannot see a buffer's extent, so
every array's shape and dtype is checked here against the plan before anything is written.
"""
import ctypes
import itertools
import weakref

import numpy as np

from . import _capi as C

_NP_DTYPES = {C.FLOAT32: np.dtype(np.float32), C.FLOAT16: np.dtype(np.float16),
              C.BFLOAT16: np.dtype(np.uint16)}  # bfloat16 as its raw bits (numpy has none)
DTYPES = {"float32": C.FLOAT32, "float16": C.FLOAT16, "bfloat16": C.BFLOAT16}
BACKENDS = {"auto": C.BACKEND_AUTO, "cpu": C.BACKEND_CPU, "cuda": C.BACKEND_CUDA}


class _Handle:
    """A C handle destroyed by close() (idempotent) or when the object goes; a closed one is
    refused with UsageError. Subclasses name their C destructor."""

    _destroy = None  # the C function that destroys the handle
    _handle = ctypes.c_void_p()

    @property
    def handle(self):
        if not self._handle:
            raise C.UsageError(C.INVALID_USAGE, "ringattn: this %s was closed" %
                               type(self).__name__)
        return self._handle

    def close(self):
        if self._handle:
            handle, self._handle = self._handle, ctypes.c_void_p()
            C.call(self._destroy, handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, or a failed comm: nothing left to do
            pass


class Comm(_Handle):
    """Who is in the ring and how bytes move (ringattn_comm_t). Destroyed when the last plan
    made over it and the Comm itself are gone (or by close())."""

    _destroy = "ringattn_comm_destroy"
    # Every Comm is registered when it is made, under an id never reused in this process:
    # torch ops take a comm as this int (their schema has no room for objects), and a
    # torch.compile trace can read an attribute but cannot register anything itself.
    _ids = itertools.count(1)
    _registry = weakref.WeakValueDictionary()

    def __init__(self, handle, keepalive=None):
        self._handle = ctypes.c_void_p(handle)
        self._keepalive = keepalive  # what the C comm calls back into (custom transports)
        self._plans = weakref.WeakSet()  # closed before the comm, which they use
        rank, size = ctypes.c_int(), ctypes.c_int()
        C.call("ringattn_comm_rank", self._handle, ctypes.byref(rank), ctypes.byref(size))
        self.rank, self.size = rank.value, size.value
        self.id = next(Comm._ids)
        Comm._registry[self.id] = self

    @staticmethod
    def by_id(cid):
        """The live Comm registered under cid, or None."""
        return Comm._registry.get(cid)

    def close(self):
        """Destroys the comm, and first every plan still open on it."""
        if self._handle:
            for plan in list(self._plans):
                plan.close()
        super().close()

    def __repr__(self):
        return "ringattn.Comm(rank=%d, size=%d)" % (self.rank, self.size)

    def grid(self, ulysses_size, strided=False):
        """This comm as a 2D grid that the library splits (Grid.split): groups of ulysses_size
        consecutive ranks (strided: ranks g, g + P / P_u, ...). Made once per shape and kept, so
        that plans cached by ringattn.torch keep finding it. Not collective."""
        key = (int(ulysses_size), bool(strided))
        grids = self.__dict__.setdefault("_grids", {})
        if key not in grids:
            grids[key] = Grid.split(self, *key)
        return grids[key]

    @staticmethod
    def threads(num_ranks):
        """num_ranks ranks as threads of this process: comms[r] is used by thread r alone."""
        handles = (ctypes.c_void_p * num_ranks)()
        C.call("ringattn_comm_create_threads", int(num_ranks), handles)
        return [Comm(h) for h in handles]

    @staticmethod
    def threads_device(num_ranks, device=-1):
        """The same for CUDA plans: every rank on one GPU, shards moved by device copies."""
        handles = (ctypes.c_void_p * num_ranks)()
        C.call("ringattn_comm_create_threads_device", int(num_ranks), int(device), handles)
        return [Comm(h) for h in handles]

    @staticmethod
    def from_mpi4py(comm):
        """A comm over an mpi4py communicator's ranks (collective over it). Passed as its
        Fortran handle, so this package does not depend on one MPI's ABI; the library must be
        built with the same MPI that mpi4py runs on."""
        if not C.has("ringattn_comm_create_mpi_fortran"):
            raise C.UnsupportedError(C.UNSUPPORTED, "ringattn: this libringattn has no "
                                     "ringattn_comm_create_mpi_fortran (too old)")
        out = ctypes.c_void_p()
        C.call("ringattn_comm_create_mpi_fortran", int(comm.py2f()), ctypes.byref(out))
        return Comm(out.value)

    @staticmethod
    def from_torch(group=None, device=None):
        """A comm over a torch.distributed group (see ringattn.comm.from_torch)."""
        from .comm import from_torch
        return from_torch(group, device)


def _window(causal, window):
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return left, (0 if causal else right)


def _int32_array(values, what):
    arr = np.ascontiguousarray(np.asarray(values), dtype=np.int64)
    if arr.ndim != 1 or arr.size < 1:
        raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s must be a 1-D sequence of "
                                     "boundaries starting at 0" % what)
    if arr.min() < 0 or arr.max() > np.iinfo(np.int32).max:
        raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s out of int32 range" % what)
    return arr.astype(np.int32)


class Plan(_Handle):
    """ringattn_plan_t for one descriptor (ringattn_plan_desc_t's fields as keywords).

    comm: None (one rank), a Comm (a ring over its ranks) or a Grid (a 2D plan). ulysses_size
    (and ulysses_strided) with a Comm: a 2D plan over that comm, split by the library, as
    comm.grid(ulysses_size, ulysses_strided) gives (threads, MPI; not a torch.distributed comm,
    whose custom transport the library cannot split: use a Grid of two comms there)."""

    _destroy = "ringattn_plan_destroy"

    def __init__(self, cu_seqlens, num_heads, head_dim, *, num_kv_heads=0, head_dim_v=0,
                 dtype="float32", layout="contiguous", cu_seqlens_k=None, causal=False,
                 window=None, scale=0.0, softcap=0.0, alibi_slopes=None, key_bias_heads=0,
                 keep_k=0, block_q=0, block_k=0, num_threads=0, backend="cpu", device=-1,
                 precision="default", comm=None, ulysses_size=0, ulysses_strided=False):
        if (dtype not in DTYPES or layout not in C.LAYOUTS or backend not in BACKENDS or
                precision not in C.PRECISIONS):
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: dtype must be one of %s, "
                                         "layout one of %s, backend one of %s, precision one "
                                         "of %s" % (sorted(DTYPES), sorted(C.LAYOUTS),
                                                    sorted(BACKENDS), sorted(C.PRECISIONS)))
        self.cu_seqlens = _int32_array(cu_seqlens, "cu_seqlens")
        self.cu_seqlens_k = (None if cu_seqlens_k is None
                             else _int32_array(cu_seqlens_k, "cu_seqlens_k"))
        slopes = (None if alibi_slopes is None
                  else np.ascontiguousarray(alibi_slopes, dtype=np.float32).reshape(-1))
        left, right = _window(causal, window)
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)
        self.num_kv_heads = int(num_kv_heads) or self.num_heads
        self.head_dim_v = int(head_dim_v) or self.head_dim
        self.dtype, self.dtype_code = dtype, DTYPES[dtype]
        self.key_bias_heads = int(key_bias_heads)
        desc = C.PlanDesc(
            num_heads=self.num_heads, num_kv_heads=int(num_kv_heads), head_dim=self.head_dim,
            head_dim_v=int(head_dim_v), dtype=self.dtype_code, layout=C.LAYOUTS[layout],
            num_seqs=self.cu_seqlens.size - 1,
            cu_seqlens=self.cu_seqlens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            causal=int(bool(causal)), window_left=left, window_right=right,
            softmax_scale=float(scale), softcap=float(softcap),
            key_bias_heads=self.key_bias_heads, keep_k=int(keep_k), block_q=int(block_q),
            block_k=int(block_k), num_threads=int(num_threads), backend=BACKENDS[backend],
            device=int(device), precision=C.PRECISIONS[precision])
        if self.cu_seqlens_k is not None:
            desc.cu_seqlens_k = self.cu_seqlens_k.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        if slopes is not None:
            desc.alibi_slopes = slopes.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        comm = _grid_of(comm, ulysses_size, ulysses_strided)
        self.comm = comm
        handle = ctypes.c_void_p()
        if isinstance(comm, Grid):
            if not C.has_2d():
                raise C.UnsupportedError(C.UNSUPPORTED, "ringattn: this libringattn (%s) has no "
                                         "2D context parallelism (0.6's ringattn_plan_create_2d)"
                                         % C.lib().ringattn_version_string().decode())
            desc.ulysses_size, desc.ulysses_strided = comm.ulysses_size, int(comm.strided)
            if comm.comm is not None:  # one comm: the library splits it
                C.call("ringattn_plan_create", comm.comm.handle, ctypes.byref(desc),
                       ctypes.byref(handle))
            else:
                C.call("ringattn_plan_create_2d", comm.group.handle, comm.ring.handle,
                       ctypes.byref(desc), ctypes.byref(handle))
        else:
            C.call("ringattn_plan_create", None if comm is None else comm.handle,
                   ctypes.byref(desc), ctypes.byref(handle))
        self._handle = handle
        if comm is not None:  # closed before any comm it runs on
            comm._plans.add(self)
            for c in comm.comms() if isinstance(comm, Grid) else ():
                c._plans.add(self)
        count = ctypes.c_int64()
        C.call("ringattn_plan_local_tokens", handle, ctypes.byref(count), None)
        index = np.empty(count.value, dtype=np.int32)
        C.call("ringattn_plan_local_tokens", handle, ctypes.byref(count),
               index.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
        self.index = index  # each local row's index in the global packed batch
        self.num_tokens = int(self.cu_seqlens[-1])
        # keys: the local query rows in a ring; every key of the batch on one rank
        self.num_keys = (int(self.cu_seqlens_k[-1]) if self.cu_seqlens_k is not None and
                         comm is None else index.size)
        tq, tk = index.size, self.num_keys
        # the shape of every tensor a call takes, checked before each call (the C API cannot)
        self.shapes = {"q": (tq, self.num_heads, self.head_dim),
                       "k": (tk, self.num_kv_heads, self.head_dim),
                       "v": (tk, self.num_kv_heads, self.head_dim_v),
                       "o": (tq, self.num_heads, self.head_dim_v),
                       "dout": (tq, self.num_heads, self.head_dim_v), "lse": (self.num_heads, tq),
                       "key_bias": (self.key_bias_heads, tk)}

    def info(self):
        """ringattn_plan_get_info as a dict: schedule, bytes per call, tiles and memory, and the
        grid (ulysses_size, ring_size; 1 and ranks for a flat ring) with the all-to-all's bytes
        per call (alltoall_*; 0 without one). In a 2D plan rank and ranks are the grid's,
        num_steps, compute_steps and forward_/backward_bytes_* the ring's (between groups)."""
        info = C.PlanInfo()
        C.call("ringattn_plan_get_info", self.handle, ctypes.byref(info))
        out = {name: getattr(info, name) for name, _ in C.PlanInfo._fields_[1:]}
        if not C.has_2d():  # a 0.5 library fills no 2D field: every plan of it is a flat ring
            out["ring_size"] = out["ranks"]
        return out

    def local_tokens(self):
        return self.index.copy()

    def positions(self):
        """Each local row's position within its own sequence (what RoPE needs)."""
        seq = np.searchsorted(self.cu_seqlens, self.index, side="right") - 1
        return (self.index - self.cu_seqlens[seq]).astype(np.int64)

    def forward_raw(self, tensors, stream=None):
        C.call("ringattn_forward", self.handle, ctypes.byref(tensors), stream)

    def backward_raw(self, tensors, stream=None):
        C.call("ringattn_backward", self.handle, ctypes.byref(tensors), stream)

    # -- numpy ---------------------------------------------------------------------------
    def _array(self, name, arr, dtype=None):
        want = self.shapes[name]
        dtype = _NP_DTYPES[self.dtype_code] if dtype is None else np.dtype(dtype)
        if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != want:
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s must be a numpy array "
                                         "of dtype %s and shape %s, got %s" %
                                         (name, dtype, want, _describe(arr)))
        if arr.ndim == 3 and arr.strides[2] != arr.itemsize:
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s's last dim must be "
                                         "contiguous (stride %d bytes)" % (name, arr.strides[2]))
        return arr

    def _tensor(self, name, arr):
        arr = self._array(name, arr)
        if _broadcast(arr):  # outputs only: the inputs went through _readable
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s is a broadcast view "
                                         "(a stride of 0): it cannot be written" % name)
        step = arr.itemsize
        if any(s % step for s in arr.strides):
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s's strides are not "
                                         "whole elements" % name)
        return C.Tensor(arr.ctypes.data, arr.strides[0] // step, arr.strides[1] // step)

    def _f32(self, name, arr):
        arr = self._array(name, arr, np.float32)
        if not arr.flags.c_contiguous:
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: %s must be packed" % name)
        return arr.ctypes.data

    def forward(self, q, k, v, key_bias=None):
        """O [T, H, D_v] and LSE [H, T] float32 of this rank's queries."""
        q, k, v = _readable(q), _readable(k), _readable(v)
        t = C.Tensors(q=self._tensor("q", q), k=self._tensor("k", k), v=self._tensor("v", v))
        if key_bias is not None:
            t.key_bias = self._f32("key_bias", key_bias)
        shapes = self.shapes
        # poisoned, so a row the library did not write would show (bfloat16: its NaN's bits)
        nan = 0x7FC0 if self.dtype_code == C.BFLOAT16 else np.nan
        out = np.full(shapes["o"], nan, dtype=_NP_DTYPES[self.dtype_code])
        lse = np.full(shapes["lse"], np.nan, dtype=np.float32)
        t.o, t.lse = self._tensor("o", out), lse.ctypes.data
        self.forward_raw(t)
        return out, lse

    def backward(self, q, k, v, out, lse, dout, key_bias=None, want_dbias=False):
        """dQ, dK, dV (and dbias when asked for) from the forward's O and LSE (SPEC 7)."""
        q, k, v, out, dout = (_readable(x) for x in (q, k, v, out, dout))
        t = C.Tensors(q=self._tensor("q", q), k=self._tensor("k", k), v=self._tensor("v", v),
                      o=self._tensor("o", out), dout=self._tensor("dout", dout))
        t.lse = self._f32("lse", lse)
        shapes = self.shapes
        grads = [np.empty(shapes[n], dtype=_NP_DTYPES[self.dtype_code]) for n in ("q", "k", "v")]
        t.dq, t.dk, t.dv = (self._tensor(n, g) for n, g in zip(("q", "k", "v"), grads))
        dbias = None
        if key_bias is not None:
            t.key_bias = self._f32("key_bias", key_bias)
            if want_dbias:
                dbias = np.empty(shapes["key_bias"], dtype=np.float32)
                t.dbias = dbias.ctypes.data
        self.backward_raw(t)
        return (*grads, dbias) if want_dbias else tuple(grads)

    def scatter(self, global_array):
        """This rank's rows of a global [T, heads, dim] array (ringattn_plan_scatter)."""
        g = np.asarray(global_array)
        dtype_code = _dtype_code(g.dtype)
        heads, dim = _heads_dim(g, self.num_tokens, "global array")
        local = np.empty((self.index.size,) + g.shape[1:], dtype=g.dtype)
        C.call("ringattn_plan_scatter", self.handle, dtype_code, heads, dim, _flat_tensor(g),
               _flat_tensor(local))
        return local

    def gather(self, local_array, out=None):
        """Writes a local array's rows into their places of a global one (others unchanged)."""
        loc = np.asarray(local_array)
        dtype_code = _dtype_code(loc.dtype)
        heads, dim = _heads_dim(loc, self.index.size, "local array")
        if out is None:
            out = np.zeros((self.num_tokens,) + loc.shape[1:], dtype=loc.dtype)
        elif out.shape != (self.num_tokens,) + loc.shape[1:] or out.dtype != loc.dtype:
            raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: gather's out must be %s "
                                         "of %s" % ((self.num_tokens,) + loc.shape[1:], loc.dtype))
        C.call("ringattn_plan_gather", self.handle, dtype_code, heads, dim, _flat_tensor(loc),
               _flat_tensor(out))
        return out


def _broadcast(arr):
    return isinstance(arr, np.ndarray) and any(
        st == 0 and n > 1 for st, n in zip(arr.strides, arr.shape))


def _readable(arr):
    """arr as the C API reads it: there a stride of 0 means packed, never a broadcast, so a
    view that repeats rows or heads (np.broadcast_to) is copied first."""
    return np.ascontiguousarray(arr) if _broadcast(arr) else arr


def _describe(arr):
    if isinstance(arr, np.ndarray):
        return "%s of shape %s" % (arr.dtype, arr.shape)
    return type(arr).__name__


def _dtype_code(dtype):
    for code, np_dtype in _NP_DTYPES.items():
        if np_dtype == dtype:
            return code
    raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: scatter/gather take float32, "
                                 "float16 or bfloat16 bits (uint16), got %s" % dtype)


def _heads_dim(arr, rows, what):
    if arr.ndim != 3 or arr.shape[0] != rows:
        raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: the %s must be [%d, heads, "
                                     "dim], got shape %s" % (what, rows, arr.shape))
    if not arr.flags.c_contiguous:
        raise C.InvalidArgumentError(C.INVALID_ARGUMENT, "ringattn: the %s must be packed" % what)
    return arr.shape[1], arr.shape[2]


def _flat_tensor(arr):
    return C.Tensor(arr.ctypes.data, 0, 0)


# after Comm: grid.py builds on it (and Comm.grid, Plan use Grid only when called)
from .grid import Grid, _grid_of  # noqa: E402,F401
