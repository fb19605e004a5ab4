"""ctypes declarations of libringattn's C ABI (include/ringattn.h): structs, prototypes, errors.

Every struct here mirrors its C declaration field for field; the library checks each struct's
struct_size against the sizes it knows, so a layout that drifted from the header is refused
(RINGATTN_ERR_INVALID_ARGUMENT) rather than misread. ctypes releases the GIL around each call,
so ranks run as Python threads in parallel.
"""
import ctypes
import os
import threading

SUCCESS, INVALID_ARGUMENT, INVALID_USAGE, UNSUPPORTED, OUT_OF_MEMORY, COMM, CUDA, INTERNAL = range(8)
FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2
LAYOUTS = {"contiguous": 0, "zigzag": 1, "striped": 2}
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
REDUCE_MIN, REDUCE_MAX, REDUCE_SUM = 0, 1, 2


class RingattnError(RuntimeError):
    """A failed libringattn call: `status` is the C status, `message` ringattn_last_error()."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__(message)


class InvalidArgumentError(RingattnError, ValueError):
    pass


class UsageError(RingattnError):
    pass


class UnsupportedError(RingattnError, NotImplementedError):
    pass


class CommError(RingattnError):
    pass


class CudaError(RingattnError):
    pass


class OutOfMemory(RingattnError, MemoryError):
    pass


_ERRORS = {INVALID_ARGUMENT: InvalidArgumentError, INVALID_USAGE: UsageError,
           UNSUPPORTED: UnsupportedError, OUT_OF_MEMORY: OutOfMemory, COMM: CommError,
           CUDA: CudaError}


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("row_stride", ctypes.c_int64),
                ("head_stride", ctypes.c_int64)]


PRECISIONS = {"default": 0, "high": 1}  # ringattn_precision_t


class PlanDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_heads", ctypes.c_int),
                ("num_kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("head_dim_v", ctypes.c_int), ("dtype", ctypes.c_int), ("layout", ctypes.c_int),
                ("num_seqs", ctypes.c_int), ("cu_seqlens", ctypes.POINTER(ctypes.c_int32)),
                ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)), ("causal", ctypes.c_int),
                ("window_left", ctypes.c_int), ("window_right", ctypes.c_int),
                ("softmax_scale", ctypes.c_float), ("softcap", ctypes.c_float),
                ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
                ("key_bias_heads", ctypes.c_int), ("keep_k", ctypes.c_int),
                ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
                ("num_threads", ctypes.c_int), ("backend", ctypes.c_int), ("device", ctypes.c_int),
                # since 0.3 (the KV cache's; not used here), since 0.4 (SPEC 9's level)
                ("sharded_cache", ctypes.c_int), ("cache_bounds", ctypes.POINTER(ctypes.c_int32)),
                ("cu_seqlens_new", ctypes.POINTER(ctypes.c_int32)), ("precision", ctypes.c_int),
                # since 0.6: 2D context parallelism (P_u; groups strided instead of consecutive)
                ("ulysses_size", ctypes.c_int), ("ulysses_strided", ctypes.c_int)]

    def __init__(self, **fields):
        # RINGATTN_PLAN_DESC_INIT's defaults
        base = dict(struct_size=struct_size(PlanDesc), window_left=-1, window_right=-1,
                    device=-1)
        base.update(fields)
        super().__init__(**base)


class Tensors(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", Tensor), ("k", Tensor), ("v", Tensor),
                ("o", Tensor), ("lse", ctypes.c_void_p), ("dout", Tensor), ("dq", Tensor),
                ("dk", Tensor), ("dv", Tensor), ("key_bias", ctypes.c_void_p),
                ("dbias", ctypes.c_void_p),
                # since 0.3 (the KV cache's new tokens; not used here), since 0.5 (SPEC 11)
                ("k_new", Tensor), ("v_new", Tensor), ("key_bias_new", ctypes.c_void_p),
                ("sinks", ctypes.c_void_p), ("dsinks", ctypes.c_void_p),
                ("dlse", ctypes.c_void_p)]

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(Tensors), **fields)


class PlanInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int), ("ranks", ctypes.c_int),
                ("local_tokens", ctypes.c_int64), ("num_steps", ctypes.c_int),
                ("compute_steps", ctypes.c_int), ("forward_bytes_sent", ctypes.c_size_t),
                ("forward_bytes_received", ctypes.c_size_t),
                ("backward_bytes_sent", ctypes.c_size_t),
                ("backward_bytes_received", ctypes.c_size_t), ("backend", ctypes.c_int),
                ("device", ctypes.c_int), ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
                ("bias_bytes_received", ctypes.c_size_t), ("workspace_bytes", ctypes.c_size_t),
                ("buffer_bytes", ctypes.c_size_t), ("host_bytes", ctypes.c_size_t),
                ("memory_bytes", ctypes.c_size_t),
                # since 0.6: a 2D plan's grid and its all-to-all's bytes per call (a flat ring:
                # ulysses_size 1, ring_size its ranks, no all-to-all)
                ("ulysses_size", ctypes.c_int), ("ring_size", ctypes.c_int),
                ("alltoall_forward_bytes_sent", ctypes.c_size_t),
                ("alltoall_forward_bytes_received", ctypes.c_size_t),
                ("alltoall_backward_bytes_sent", ctypes.c_size_t),
                ("alltoall_backward_bytes_received", ctypes.c_size_t)]

    def __init__(self):
        # RINGATTN_PLAN_INFO_INIT's defaults
        super().__init__(struct_size=struct_size(PlanInfo), device=-1, ulysses_size=1,
                         ring_size=1)


# The structs' sizes in releases before 0.6 (the fields above the "since 0.6" ones). The library
# takes every released size, so against a 0.5 library (no ringattn_plan_create_2d) the structs
# are passed at their 0.5 size and work as before, without the 2D fields: struct_size() picks.
class _PlanDesc05(ctypes.Structure):
    _fields_ = PlanDesc._fields_[:-2]


class _PlanInfo05(ctypes.Structure):
    _fields_ = PlanInfo._fields_[:-6]


_OLD_SIZES = {PlanDesc: ctypes.sizeof(_PlanDesc05), PlanInfo: ctypes.sizeof(_PlanInfo05)}


def has_2d():
    """Whether the loaded library has 2D context parallelism (0.6: ringattn_plan_create_2d)."""
    return has("ringattn_plan_create_2d")


def struct_size(cls):
    """The struct_size to pass for PlanDesc or PlanInfo: the current one, or the 0.5 one where the
    loaded library predates 0.6 (it would refuse a size it does not know)."""
    return ctypes.sizeof(cls) if has_2d() else _OLD_SIZES[cls]


# The public custom transport (include/ringattn_transport.h): the callbacks a framework
# implements so that the ring's bytes move over it (ringattn.comm's torch.distributed binding).
class TransportMsg(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("bytes", ctypes.c_size_t), ("peer", ctypes.c_int)]


SENDRECV_START = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(TransportMsg),
                                  ctypes.c_int, ctypes.POINTER(TransportMsg), ctypes.c_int,
                                  ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
TEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.POINTER(ctypes.c_int))
WAIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double,
                        ctypes.POINTER(ctypes.c_int))
ALLREDUCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                             ctypes.c_int, ctypes.c_int)
RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Transport(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("user", ctypes.c_void_p),
                ("sendrecv_start", SENDRECV_START), ("test", TEST), ("wait", WAIT),
                ("allreduce", ALLREDUCE), ("release", RELEASE)]


_P = ctypes.c_void_p
_PROTOTYPES = {
    "ringattn_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "ringattn_last_error": (ctypes.c_char_p, []),
    "ringattn_version": (ctypes.c_int, []),
    "ringattn_version_string": (ctypes.c_char_p, []),
    "ringattn_cpu_kernels": (ctypes.c_char_p, []),
    "ringattn_build_info": (ctypes.c_char_p, []),
    "ringattn_set_log_callback": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]),
    "ringattn_comm_create_threads": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_P)]),
    "ringattn_comm_create_threads_device": (ctypes.c_int,
                                            [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_P)]),
    "ringattn_comm_rank": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int),
                                          ctypes.POINTER(ctypes.c_int)]),
    "ringattn_comm_destroy": (ctypes.c_int, [_P]),
    "ringattn_plan_create": (ctypes.c_int, [_P, ctypes.POINTER(PlanDesc), ctypes.POINTER(_P)]),
    "ringattn_plan_local_tokens": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int64),
                                                  ctypes.POINTER(ctypes.c_int32)]),
    "ringattn_plan_get_info": (ctypes.c_int, [_P, ctypes.POINTER(PlanInfo)]),
    "ringattn_plan_scatter": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                             Tensor, Tensor]),
    "ringattn_plan_gather": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            Tensor, Tensor]),
    "ringattn_forward": (ctypes.c_int, [_P, ctypes.POINTER(Tensors), _P]),
    "ringattn_backward": (ctypes.c_int, [_P, ctypes.POINTER(Tensors), _P]),
    "ringattn_plan_destroy": (ctypes.c_int, [_P]),
    "ringattn_merge_partials": (ctypes.c_int, [ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                               ctypes.c_int, ctypes.c_int, ctypes.POINTER(Tensor),
                                               ctypes.POINTER(_P), Tensor, _P]),
    # entry points that only some builds or versions have: looked up by has()
    "ringattn_plan_create_2d": (ctypes.c_int, [_P, _P, ctypes.POINTER(PlanDesc),
                                               ctypes.POINTER(_P)]),
    "ringattn_comm_create_mpi_fortran": (ctypes.c_int, [ctypes.c_int64, ctypes.POINTER(_P)]),
    "ringattn_comm_create_custom": (ctypes.c_int, [ctypes.POINTER(Transport), ctypes.c_int,
                                                   ctypes.c_int, ctypes.POINTER(_P)]),
    "ringattn_comm_create_nccl_id": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                                    ctypes.c_int, ctypes.POINTER(_P)]),
    "ringattn_comm_create_nccl": (ctypes.c_int, [_P, ctypes.POINTER(_P)]),
    "ringattn_nccl_get_unique_id": (ctypes.c_int, [ctypes.c_char_p]),
}

_lock = threading.Lock()
_lib = None


def library_path():
    """The libringattn this package loads: $RINGATTN_LIBRARY, else the one in the package."""
    env = os.environ.get("RINGATTN_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("libringattn.so"):
            return os.path.join(here, name)
    raise ImportError("ringattn: libringattn is not in the package folder %s (pip install ./python "
                      "builds it) and RINGATTN_LIBRARY is not set" % here)


def lib():
    global _lib
    with _lock:
        if _lib is None:
            handle = ctypes.CDLL(library_path())
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(handle, name, None)
                if fn is not None:
                    fn.restype, fn.argtypes = restype, argtypes
            _lib = handle
    return _lib


def has(name):
    """Whether the loaded library exports `name` (MPI, NCCL and CUDA entry points vary by build)."""
    return getattr(lib(), name, None) is not None


def last_error():
    return lib().ringattn_last_error().decode("utf-8", "replace")


def check(status):
    """Raises the status's exception with ringattn_last_error() unless it is RINGATTN_SUCCESS."""
    if status != SUCCESS:
        message = last_error() or lib().ringattn_status_string(status).decode()
        raise _ERRORS.get(status, RingattnError)(status, message)


def call(name, *args):
    check(getattr(lib(), name)(*args))
