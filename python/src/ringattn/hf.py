"""ringattn for Hugging Face transformers: the attention implementation "ringattn".

    import ringattn.hf
    ringattn.hf.register()       # idempotent
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="ringattn")
    # or model.set_attn_implementation("ringattn")

One rank (no ring): a drop-in for "eager"/"sdpa" on the masks ringattn computes exactly.
HF's [B, H, S, D] query and [B, H_kv, S_k, D] key/value (not repeated for GQA) are packed to
ringattn's varlen layout, each batch row one sequence, or several when:
  - cu_seq_lens_q / cu_seq_lens_k are passed to the model (as for HF's flash path); they index
    the flattened B * S tokens; or
  - position_ids restart: a token whose position is not its predecessor's + 1 starts a sequence
    (the rule of transformers' sdpa/eager masks, masking_utils.find_packed_sequence_indices).
Packing is looked for only when S_k == S; transformers' own eager/sdpa masks look for it only
without a cache, so pass use_cache=False to compare with them (and in training). With a KV
cache (S_k > S) each row is one sequence, its queries the last S of its S_k keys (bottom-right
aligned); a non-causal module (cross-attention) attends to all S_k keys of its row.

A ring over P ranks (sequence parallelism): every rank enters the same Ring, a thread-local
context, so threads of one process (ringattn.Comm.threads) can be ranks:

    with ringattn.hf.ring(comm, cu_seqlens, layout="zigzag") as r:    # collective
        ids = r.shard(input_ids)                 # [1, T_local]: this rank's tokens (dim 1)
        out = model(ids, position_ids=r.position_ids, use_cache=False)  # RoPE positions
        logits = r.unshard(out.logits)           # [1, T, V]: this rank's rows, zeros elsewhere
        loss(out.logits).backward()              # collective too: keep it inside the `with`

cu_seqlens are the GLOBAL packed batch's boundaries (several documents in one row are fine),
the same on every rank; each rank's model sees only its own T_local tokens in one batch row.
Every attention call on the ring is collective, so every rank runs the same model calls in
the same order. A Ring may also be passed to the model as the keyword `ringattn_ring=r`
(transformers hands it to each attention call), which overrides the context and survives
recomputation outside the `with` (gradient checkpointing).

What it cannot express it refuses (NotImplementedError or ValueError naming it), never drops:
a padding attention_mask with zeros, an arbitrary 4D mask, mask overlays (or/and mask
functions, block/chunked attention, bidirectional sliding windows), static-cache key slots,
dropout > 0, output_attentions, attention sinks (s_aux), paged attention, and in a ring a
batch of more than one row, a KV cache, or position_ids other than the ring's.

Conventions, checked against transformers 5.24's masks: sliding_window = w keeps the w keys
q - w + 1 .. q (masking_utils.sliding_window_overlay: kv_idx > q_idx - w), i.e. ringattn's
window (w - 1, 0); softcap c is c * tanh(scaling * q.k / c) (Gemma 2); scaling None is
1/sqrt(D); is_causal comes from the is_causal keyword when given, else module.is_causal.
"""
import inspect
import threading

import torch

from . import torch as rt

__all__ = ["register", "attention_forward", "mask_interface", "ring", "Ring", "current_ring",
           "NAME"]

NAME = "ringattn"

# ---------------------------------------------------------------------------------------------
# The ring: a thread-local stack of active Rings

_local = threading.local()


class Ring:
    """A sequence-parallel ring for HF models: comm, the GLOBAL cu_seqlens and a layout.

    Making one is collective over comm (it plans the token layout). Use it as a context manager
    (thread-local: each rank's thread enters its own) or pass it as model(..., ringattn_ring=r).
    """

    def __init__(self, comm, cu_seqlens, layout="zigzag"):
        self.comm = comm
        self.layout = layout
        self.plan = rt.plan(cu_seqlens, layout=layout, comm=comm)
        self.cu_seqlens = list(self.plan.cu_seqlens)
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
    """A Ring (see the module docstring); `with ring(...) as r:` makes it this thread's."""
    return Ring(comm, cu_seqlens, layout)


def current_ring():
    """The innermost Ring this thread has entered, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


# ---------------------------------------------------------------------------------------------
# The mask interface: no O(S^2) mask, and a refusal of every pattern ringattn does not compute

# mask_function pieces (transformers.masking_utils) whose pattern the attention function
# reproduces from its own arguments: causal or full, the causal sliding window, packed
# sequences found from position_ids.
_KNOWN_MASK_PIECES = {
    "causal_mask_function",
    "bidirectional_mask_function",
    "and_masks.<locals>.and_mask",
    "sliding_window_overlay.<locals>.inner_mask",
    "remap_positions_for_packed_sequence.<locals>.inner_mask",
    "packed_sequence_mask_function.<locals>.inner_mask",
    "padding_mask_function.<locals>.inner_mask",
}


def _mask_pieces(fn, depth=0):
    """Yields every function in a mask_function's closure tree (and_masks holds a tuple)."""
    yield fn
    if depth > 32 or not inspect.isfunction(fn):
        return
    for cell in fn.__closure__ or ():
        try:
            item = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        for sub in (item if isinstance(item, (tuple, list)) else (item,)):
            if callable(sub) and not isinstance(sub, (torch.Tensor, type)):
                yield from _mask_pieces(sub, depth + 1)


def _check_mask_function(mask_function):
    """The names of a mask_function's pieces; NotImplementedError for any not known."""
    names, unknown = set(), []
    for piece in _mask_pieces(mask_function):
        name = getattr(piece, "__qualname__", type(piece).__name__)
        module = getattr(piece, "__module__", "")
        if not (inspect.isfunction(piece) and module == "transformers.masking_utils"
                and name in _KNOWN_MASK_PIECES):
            unknown.append(name if module == "transformers.masking_utils"
                           else "%s.%s" % (module, name))
        names.add(name)
    if unknown:
        raise NotImplementedError(
            "ringattn: the model builds a mask ringattn cannot express (%s); it computes causal "
            "or full attention, a causal sliding window and packed sequences only, not or/and "
            "mask overlays, block or chunked attention or bidirectional sliding windows"
            % ", ".join(sorted(set(unknown))))
    return names


def mask_interface(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                   mask_function=None, attention_mask=None, **kwargs):
    """AttentionMaskInterface entry: None (no mask tensor), or the 2D padding mask for the
    attention function to refuse. Refuses mask patterns it cannot express and causal masks
    whose keys are not the contiguous run ending at the last query (static caches)."""
    names = _check_mask_function(mask_function) if mask_function is not None else set()
    # a causal mask aligns the keys bottom-right: they must be the run that ends at the last
    # query (a full mask, e.g. cross-attention to an encoder, attends to every key anyway)
    if "causal_mask_function" in names:
        if isinstance(q_offset, torch.Tensor) or isinstance(kv_offset, torch.Tensor):
            raise NotImplementedError("ringattn: static caches (tensor offsets) are not supported")
        if kv_offset + kv_length != q_offset + q_length:
            raise NotImplementedError(
                "ringattn: keys %d..%d do not end at the last query %d (a static cache's "
                "unfilled slots?); ringattn needs keys that end at the last query: use a "
                "DynamicCache" % (kv_offset, kv_offset + kv_length - 1, q_offset + q_length - 1))
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[-1] == kv_length and bool(attention_mask.all()):
            return None
    return attention_mask


# ---------------------------------------------------------------------------------------------
# The attention function

def _ints(x, what):
    return list(rt.host_ints(x, what))


def _cu_from_positions(position_ids, batch, seq):
    """Sequence starts where a position is not its predecessor's + 1, and at every row."""
    pos = position_ids.detach()
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    if pos.dim() != 2 or pos.shape[-1] != seq or pos.shape[0] not in (1, batch):
        raise ValueError("ringattn: position_ids of shape %s for a batch of %d rows of %d tokens"
                         % (tuple(position_ids.shape), batch, seq))
    pos = pos.expand(batch, seq)
    starts = torch.ones((batch, seq), dtype=torch.bool, device=pos.device)
    starts[:, 1:] = (pos[:, 1:] - pos[:, :-1]) != 1
    return starts.reshape(-1).nonzero().reshape(-1).cpu().tolist() + [batch * seq]


def _refuse(module, attention_mask, dropout, kwargs):
    if attention_mask is not None:
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            if not bool(attention_mask.all()):
                raise NotImplementedError(
                    "ringattn: a padding attention_mask with zeros is not supported; pack the "
                    "sequences instead (position_ids restarting at 0, or cu_seq_lens_q/k)")
        else:
            shape = tuple(getattr(attention_mask, "shape", ()))
            raise NotImplementedError(
                "ringattn: an explicit attention mask (%s of shape %s) is not supported; "
                "ringattn computes causal/full attention, sliding windows and packed sequences "
                "from the model's config and position_ids" % (type(attention_mask).__name__, shape))
    if dropout is not None and float(dropout) > 0.0:
        raise NotImplementedError(
            "ringattn: attention dropout (p=%g) is not supported; set the config's "
            "attention_dropout to 0 or call model.eval()" % float(dropout))
    config = getattr(module, "config", None)
    if kwargs.get("output_attentions") or getattr(config, "output_attentions", False):
        raise NotImplementedError(
            "ringattn: output_attentions is not supported (the attention weights are never "
            "formed); use attn_implementation='eager' to get them")
    for name in ("s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise NotImplementedError("ringattn: attention sinks (%s) are not supported" % name)
    for name in ("block_table", "k_cache", "v_cache"):
        if kwargs.get(name) is not None:
            raise NotImplementedError("ringattn: paged attention (%s) is not supported" % name)


def _window(sliding_window, causal):
    if sliding_window is None:
        return (-1, -1)
    w = int(sliding_window)
    if w < 1:
        raise ValueError("ringattn: sliding_window must be >= 1, got %d" % w)
    if not causal:
        raise NotImplementedError(
            "ringattn: a bidirectional sliding window is not supported (transformers' sdpa and "
            "flash paths disagree on its width)")
    # HF keeps kv_idx > q_idx - w: the w keys q - w + 1 .. q, the query's own included
    return (w - 1, 0)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """The AttentionInterface function: query [B, H, S, D], key/value [B, H_kv, S_k, D(_v)]
    -> (attn_output [B, S, H, D_v], None)."""
    _refuse(module, attention_mask, dropout, kwargs)
    ring_ = kwargs.get("ringattn_ring")
    if ring_ is None:
        ring_ = current_ring()
    if ring_ is not None and not isinstance(ring_, Ring):
        raise TypeError("ringattn: ringattn_ring must be a ringattn.hf.Ring, got %r" % (ring_,))
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = _window(sliding_window, causal)

    b, h, s, d = query.shape
    bk, h_kv, s_k, _ = key.shape
    if bk != b or value.shape[0] != b or value.shape[2] != s_k:
        raise ValueError("ringattn: query %s, key %s and value %s disagree on batch or keys"
                         % (tuple(query.shape), tuple(key.shape), tuple(value.shape)))
    cu_q_kw = kwargs.get("cu_seq_lens_q")
    cu_k_kw = kwargs.get("cu_seq_lens_k")
    position_ids = kwargs.get("position_ids")
    cu_k = None
    if ring_ is not None:
        if b != 1:
            raise ValueError("ringattn: in a ring the model takes one batch row of this rank's "
                             "%d tokens, got a batch of %d rows (pack the documents into one "
                             "row: the Ring's cu_seqlens)" % (ring_.num_local_tokens, b))
        if s_k != s:
            raise NotImplementedError("ringattn: a KV cache (%d keys for %d queries) is not "
                                      "supported in a ring" % (s_k, s))
        if s != ring_.num_local_tokens:
            raise ValueError("ringattn: this rank holds %d tokens of the ring's batch, the model "
                             "got %d (shard the input with Ring.shard)"
                             % (ring_.num_local_tokens, s))
        for name, given in (("cu_seq_lens_q", cu_q_kw), ("cu_seq_lens_k", cu_k_kw)):
            given = None if given is None else _ints(given, name)
            if given is not None and given != ring_.cu_seqlens:
                raise ValueError("ringattn: %s %s differs from the ring's global cu_seqlens %s"
                                 % (name, given, ring_.cu_seqlens))
        if position_ids is not None:
            pos = position_ids.detach().reshape(-1)
            if pos.numel() != s or not torch.equal(pos.cpu().long(), ring_.positions):
                raise ValueError("ringattn: position_ids are not this rank's positions in the "
                                 "ring: pass position_ids=ring.position_ids")
        cu_q, layout, comm = ring_.cu_seqlens, ring_.layout, ring_.comm
    else:
        layout, comm = "contiguous", None
        if cu_q_kw is not None:
            cu_q = _ints(cu_q_kw, "cu_seq_lens_q")
            cu_k = _ints(cu_k_kw, "cu_seq_lens_k") if cu_k_kw is not None else None
            if cu_k == cu_q:
                cu_k = None
        elif cu_k_kw is not None:
            raise ValueError("ringattn: cu_seq_lens_k given without cu_seq_lens_q")
        elif s_k != s:  # KV cache: one sequence per row, bottom-right aligned
            cu_q = [i * s for i in range(b + 1)]
            cu_k = [i * s_k for i in range(b + 1)]
        elif position_ids is not None:
            cu_q = _cu_from_positions(position_ids, b, s)
        else:
            cu_q = [i * s for i in range(b + 1)]
        if cu_q[0] != 0 or cu_q[-1] != b * s:
            raise ValueError("ringattn: cu_seq_lens_q %s must run from 0 to the %d query tokens"
                             % (cu_q, b * s))
        if cu_k is None and s_k != s:
            raise ValueError("ringattn: cu_seq_lens_q without cu_seq_lens_k for %d keys and %d "
                             "queries per row" % (s_k, s))
        if cu_k is not None and (cu_k[0] != 0 or cu_k[-1] != b * s_k or len(cu_k) != len(cu_q)):
            raise ValueError("ringattn: cu_seq_lens_k %s must run from 0 to the %d key tokens, "
                             "one boundary per cu_seq_lens_q's" % (cu_k, b * s_k))

    q = query.transpose(1, 2).reshape(b * s, h, d)
    k = key.transpose(1, 2).reshape(b * s_k, h_kv, d)
    v = value.transpose(1, 2).reshape(b * s_k, h_kv, value.shape[-1])
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out, _ = rt.attention(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=causal, window=window,
                          softcap=0.0 if softcap is None else float(softcap),
                          scale=None if scaling is None else float(scaling),
                          layout=layout, comm=comm)
    return out.reshape(b, s, h, out.shape[-1]), None


def register():
    """Registers "ringattn" with transformers' AttentionInterface and AttentionMaskInterface
    (idempotent). The mask entry is needed: without one, transformers 5 builds no mask for an
    unknown implementation and would drop a padding mask silently."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_interface)
    return NAME
