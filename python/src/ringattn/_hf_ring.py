"""The ring of ringattn.hf: a thread-local stack of Rings, and a ring's labels for HF's loss.

Split from hf.py (the attention function and the mask entry): see hf.py's docstring for use.
"""
import threading

import torch

from . import torch as rt

_local = threading.local()


class Ring:
    """A sequence-parallel ring for HF models: comm, the GLOBAL cu_seqlens and a layout.

    comm: a ringattn.Comm, or a ringattn.Grid (2D context parallelism: the rows are then the
    grid's). Making one is collective over comm (it plans the token layout). Use it as a context
    manager (thread-local: each rank's thread enters its own) or pass it as
    model(..., ringattn_ring=r).
    """

    def __init__(self, comm, cu_seqlens, layout="zigzag"):
        self.comm = comm
        self.layout = layout
        self.plan = rt.plan(cu_seqlens, layout=layout, comm=comm)
        self.cu_seqlens = list(self.plan.cu_seqlens)
        # the attention reads the boundaries from a tensor: a compiled model would be traced
        # again for every new list of them (a trace specialises on Python ints), not for a
        # tensor's new values
        self._cu_tensor = torch.tensor(self.cu_seqlens, dtype=torch.int32)
        self.positions = rt.positions(self.plan)  # [T_local] LongTensor

    @property
    def num_local_tokens(self):
        return int(self.positions.numel())

    @property
    def position_ids(self):
        """[1, T_local]: the position_ids to give this rank's model call (RoPE)."""
        return self.positions.unsqueeze(0)

    def shard(self, x, dim=1):
        """This rank's tokens of a global tensor along dim (1: HF's [B=1, T, ...])."""
        return rt.shard(x, self.plan, dim=dim)

    def unshard(self, x, dim=1):
        """A global tensor with this rank's tokens in place, zeros elsewhere (sum over ranks)."""
        return rt.unshard(x, self.plan, dim=dim)

    def shift_labels(self, labels, ignore_index=-100):
        """(shift_labels, num_items_in_batch): this rank's targets for a causal LM loss.

        labels: the GLOBAL batch's labels, [1, T] or [T] (usually the input ids, ignore_index
        where no loss is wanted). A token's target is the next token's label in its own
        document: the batch is shifted once, globally, and the last token of every document
        gets ignore_index. HF's own labels= cannot do this in a ring: it shifts each rank's
        shard by itself, pairing tokens that are not neighbours (zigzag shards are not even
        contiguous) and dropping the targets across shard boundaries. Returns this rank's
        shifted labels (the input's rank, T_local tokens) and the number of targets over the
        whole batch (a 0-d tensor): HF's loss with num_items_in_batch is this rank's summed
        cross-entropy divided by it, so the ranks' losses add up to the one-process mean.

            sl, n = r.shift_labels(labels)
            out = model(r.shard(ids), position_ids=r.position_ids, labels=sl,
                        shift_labels=sl, num_items_in_batch=n)   # labels= only turns the loss on
        """
        t = self.cu_seqlens[-1]
        if labels.dim() not in (1, 2) or labels.shape[-1] != t or labels.numel() != t:
            raise ValueError("ringattn: labels of shape %s for a ring of one row of %d tokens "
                             "(pass the global batch's labels, [1, T] or [T])"
                             % (tuple(labels.shape), t))
        flat = labels.detach().reshape(-1)
        shifted = torch.full_like(flat, ignore_index)
        shifted[:-1] = flat[1:]
        ends = [b - 1 for a, b in zip(self.cu_seqlens[:-1], self.cu_seqlens[1:]) if b > a]
        shifted[torch.tensor(ends, dtype=torch.long, device=flat.device)] = ignore_index
        count = (shifted != ignore_index).sum()
        return self.shard(shifted.reshape(labels.shape), dim=labels.dim() - 1), count

    def __enter__(self):
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        stack = _local.stack
        if not stack or stack[-1] is not self:
            raise RuntimeError("ringattn.hf: Ring contexts exited out of order")
        stack.pop()
        return False

    def __repr__(self):
        return "Ring(%d of %d tokens, layout=%s)" % (self.num_local_tokens, self.cu_seqlens[-1],
                                                     self.layout)


def ring(comm, cu_seqlens, layout="zigzag"):
    """A Ring (see hf.py's docstring); `with ring(...) as r:` makes it this thread's."""
    return Ring(comm, cu_seqlens, layout)


def current_ring():
    """The innermost Ring this thread has entered, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None
