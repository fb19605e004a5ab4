"""ringattn communicators over torch.distributed groups.

from_torch(group, device):
- CUDA tensors (device a CUDA device, or the group's backend NCCL): ringattn's own NCCL
  communicator, joined with a unique id that the group's rank 0 makes with the library's own
  NCCL (ringattn_nccl_get_unique_id) and broadcasts over the group. The library must be built
  with CUDA and NCCL.
- CPU tensors (gloo, or any backend with isend/irecv and all_reduce): the public custom
  transport (include/ringattn_transport.h) implemented here over torch.distributed. The library
  calls it on the thread that called it (plan creation, forward, backward), so the callbacks run
  with the GIL taken by ctypes while the calling thread waits in C. The control plane's
  all_reduce, which the library cannot bound, waits at most RINGATTN_COMM_TIMEOUT seconds.
"""
import ctypes
import logging
import os
import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _capi as C
from .core import Comm

_log = logging.getLogger("ringattn")
_OPS = {C.REDUCE_MIN: dist.ReduceOp.MIN, C.REDUCE_MAX: dist.ReduceOp.MAX,
        C.REDUCE_SUM: dist.ReduceOp.SUM}


def _timeout_s():
    """RINGATTN_COMM_TIMEOUT as the library reads it (comm/comm.c): positive, else 60."""
    try:
        s = float(os.environ.get("RINGATTN_COMM_TIMEOUT", "0"))
    except ValueError:
        s = 0.0
    return s if s > 0 else 60.0


def _byte_view(address, nbytes):
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


class TorchTransport:
    """The custom transport's callbacks over torch.distributed point-to-point and all_reduce.

    A posted batch is waited for by one waiter thread of the transport, in posting order: gloo's
    send works report completion only to wait(), never to is_completed(), so polling them would
    never see them end. The callbacks themselves run on the thread that called the library
    (include/ringattn_transport.h) and only look at what the waiter recorded.
    """

    def __init__(self, group):
        self.group = group
        self.next_request = 1
        self.finished = {}  # request -> None, or the exception its works raised
        self.cond = threading.Condition()
        self.queue = queue.Queue()
        self.waiter = threading.Thread(target=self._wait_works, name="ringattn-torch-waiter",
                                       daemon=True)
        self.waiter.start()
        self.struct = C.Transport(
            struct_size=ctypes.sizeof(C.Transport),
            sendrecv_start=C.SENDRECV_START(self._guard(self._sendrecv_start)),
            test=C.TEST(self._guard(self._test)), wait=C.WAIT(self._guard(self._wait)),
            allreduce=C.ALLREDUCE(self._guard(self._allreduce)),
            release=C.RELEASE(self._release))

    def _guard(self, fn):
        # an exception must not cross into C: it becomes a nonzero code (RINGATTN_ERR_COMM)
        def callback(*args):
            try:
                fn(*args)
                return 0
            except Exception as exc:  # noqa: BLE001 - reported, then the call fails in C
                _log.error("ringattn: torch.distributed transport: %s: %r", fn.__name__, exc)
                return 1
        return callback

    def _wait_works(self):
        while True:
            rid, works = self.queue.get()
            if rid is None:
                return
            error = None
            for w in works:
                try:
                    w.wait()
                except Exception as exc:  # noqa: BLE001 - handed to test/wait
                    error = error or exc
            # drop the works now: a work kept alive by this thread's frame past
            # destroy_process_group outlives its process group and aborts the interpreter's exit
            works = w = None
            with self.cond:
                self.finished[rid] = error
                self.cond.notify_all()

    def _release(self, user):
        self.queue.put((None, None))
        self.waiter.join()

    def _global(self, peer):
        return dist.get_global_rank(self.group, peer) if self.group is not None else peer

    def _sendrecv_start(self, user, sends, num_sends, recvs, num_recvs, tag, request):
        works = []
        for i in range(num_recvs):
            m = recvs[i]
            works.append(dist.irecv(_byte_view(m.buf, m.bytes), src=self._global(m.peer),
                                    group=self.group, tag=tag + i))
        for i in range(num_sends):
            m = sends[i]
            works.append(dist.isend(_byte_view(m.buf, m.bytes), dst=self._global(m.peer),
                                    group=self.group, tag=tag + i))
        rid = self.next_request
        self.next_request += 1
        self.queue.put((rid, works))
        request[0] = rid

    def _take(self, rid, done):
        # lock held: *done = 1 once the waiter finished the request (its error raised here)
        if rid not in self.finished:
            done[0] = 0
            return
        error = self.finished.pop(rid)
        done[0] = 1
        if error is not None:
            raise error

    def _test(self, user, request, done):
        with self.cond:
            self._take(request, done)

    def _wait(self, user, request, timeout_s, done):
        with self.cond:
            self.cond.wait_for(lambda: request in self.finished, timeout=timeout_s)
            self._take(request, done)

    def _allreduce(self, user, vals, n, op):
        # bounded by RINGATTN_COMM_TIMEOUT, as the header asks: a failed peer that skipped the
        # closing agreement must not keep this rank in it for the group's own timeout
        t = torch.tensor([vals[i] for i in range(n)], dtype=torch.int64)
        work = dist.all_reduce(t, op=_OPS[op], group=self.group, async_op=True)
        work.wait(timeout=timedelta(seconds=_timeout_s()))
        for i, x in enumerate(t.tolist()):
            vals[i] = x


def from_torch(group=None, device=None):
    """A Comm over the ranks of a torch.distributed group (None: the default group), in the
    group's rank order. Collective over the group."""
    if not dist.is_initialized():
        raise C.UsageError(C.INVALID_USAGE, "ringattn: Comm.from_torch needs "
                           "torch.distributed.init_process_group first")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    device = None if device is None else torch.device(device)
    cuda = (device is not None and device.type == "cuda") or (
        device is None and dist.get_backend(group) == "nccl")
    if cuda:
        return _nccl(group, rank, size, device)
    if not C.has("ringattn_comm_create_custom"):
        raise C.UnsupportedError(C.UNSUPPORTED, "ringattn: this libringattn has no custom "
                                 "transport (ringattn_comm_create_custom)")
    transport = TorchTransport(group)
    out = ctypes.c_void_p()
    C.call("ringattn_comm_create_custom", ctypes.byref(transport.struct), rank, size,
           ctypes.byref(out))
    return Comm(out.value, keepalive=transport)


def _nccl(group, rank, size, device):
    if not (C.has("ringattn_nccl_get_unique_id") and C.has("ringattn_comm_create_nccl_id")):
        raise C.UnsupportedError(C.UNSUPPORTED, "ringattn: this libringattn has no NCCL transport "
                                 "(pip install ./python -Ccmake.define.RINGATTN_ENABLE_CUDA=ON)")
    ident = [None]
    if rank == 0:
        buf = ctypes.create_string_buffer(128)
        C.call("ringattn_nccl_get_unique_id", buf)
        ident[0] = buf.raw
    dist.broadcast_object_list(ident, src=dist.get_global_rank(group, 0) if group else 0,
                               group=group)
    index = -1 if device is None or device.index is None else device.index
    out = ctypes.c_void_p()
    C.call("ringattn_comm_create_nccl_id", ident[0], size, rank, index, ctypes.byref(out))
    return Comm(out.value)
