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

A causal LM's loss in a ring: HF's labels= would shift each rank's shard by itself (pairing
tokens that are not neighbours); Ring.shift_labels shifts the global labels once, ends every
document, and counts the targets of the whole batch, so that the ranks' losses (and gradients)
add up to the one-process loss:

        sl, n = r.shift_labels(labels)           # labels: the global [1, T]
        loss = model(ids, position_ids=r.position_ids, labels=sl, shift_labels=sl,
                     num_items_in_batch=n).loss  # labels= only turns HF's loss on

torch.compile(model, fullgraph=True) traces without graph breaks, on one rank and in a ring:
the work on tensor values (documents from position_ids or cu_seq_lens, the checks of a padding
mask and of a ring's inputs) is the op ringattn::hf_seqlens, run when the model runs: other
documents (or a new Ring) do not trace the model again (a new number of documents does, once,
with dynamic shapes after it), and a padding mask with zeros is refused when the compiled
model runs. transformers' mask functions made inside the trace are named by their code
(co_qualname): Python 3.11+ (on older ones the trace refuses them as unknown).

What it cannot express it refuses (NotImplementedError or ValueError naming it), never drops:
a padding attention_mask with zeros, an arbitrary 4D mask, mask overlays (or/and mask
functions, block/chunked attention, bidirectional sliding windows), static-cache key slots,
dropout > 0, output_attentions, paged attention, and in a ring a
batch of more than one row, a KV cache, or position_ids other than the ring's. Attention sinks
(gpt-oss's s_aux) are ringattn's own (SPEC 11: once per row, in the ring too; their gradient
on each rank is its rows' part, summed over the ranks as every parameter's).

Conventions, checked against transformers 5.24's masks: sliding_window = w keeps the w keys
q - w + 1 .. q (masking_utils.sliding_window_overlay: kv_idx > q_idx - w), i.e. ringattn's
window (w - 1, 0); softcap c is c * tanh(scaling * q.k / c) (Gemma 2); scaling None is
1/sqrt(D); is_causal comes from the is_causal keyword when given, else module.is_causal.
"""
import inspect
from typing import List, Optional

import torch

from . import torch as rt
from ._hf_ring import Ring, current_ring, ring

__all__ = ["register", "attention_forward", "mask_interface", "ring", "Ring", "current_ring",
           "NAME"]

NAME = "ringattn"

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


def _qualname(fn):
    """fn's qualified name, read from its code where it has one: under torch.compile the
    closures transformers makes inside the trace have no __qualname__, but their __code__ is
    the real one (co_qualname: Python 3.11+)."""
    name = getattr(getattr(fn, "__code__", None), "co_qualname", None)
    return name if name is not None else getattr(fn, "__qualname__", type(fn).__name__)


def _check_mask_function(mask_function):
    """The names of a mask_function's pieces; NotImplementedError for any not known."""
    names, unknown = set(), []
    for piece in _mask_pieces(mask_function):
        name = _qualname(piece)
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
        # a traced model cannot branch on the mask's values: it goes to the attention function,
        # whose host op refuses zeros when the model runs
        if (not torch.compiler.is_compiling() and attention_mask.shape[-1] == kv_length
                and bool(attention_mask.all())):
            return None
    return attention_mask


# ---------------------------------------------------------------------------------------------
# The attention function

# The batch's boundaries and the checks on tensor values, in an op. Packed boundaries found
# from position_ids, cu_seq_lens given to the model, a padding mask and a ring's position_ids
# are tensor values read on the host: a trace cannot read them (under torch.compile each read
# is a graph break, and fullgraph=True fails), so they are this op's real kernel, run when the
# model runs, eager or compiled; its fake kernel gives the shapes. It returns cu_seqlens and
# cu_seqlens_k for ringattn::forward as CPU int32 tensors whose sizes follow from shapes alone:
# boundaries found from position_ids fill B * S + 1 entries, the unused ones repeating the
# total (empty sequences, which the forward drops), and cu_seqlens_k is empty where the keys
# follow the queries' boundaries.

def _int32(values):
    return torch.tensor(list(values), dtype=torch.int32, device="cpu")


def _cu_from_positions(position_ids, batch, seq):
    """Sequence starts where a position is not its predecessor's + 1, and at every row; then
    the total up to batch * seq + 1 entries."""
    pos = position_ids.detach().cpu().long().reshape(-1, seq).expand(batch, seq)
    starts = torch.ones((batch, seq), dtype=torch.bool, device="cpu")
    starts[:, 1:] = (pos[:, 1:] - pos[:, :-1]) != 1
    found = starts.reshape(-1).nonzero().reshape(-1)
    cu = torch.full((batch * seq + 1,), batch * seq, dtype=torch.int32, device="cpu")
    cu[:found.numel()] = found
    return cu


def _given(cu, name, total):
    cu = list(rt.host_ints(cu, name))
    if cu[0] != 0 or cu[-1] != total:
        raise ValueError("ringattn: %s %s must run from 0 to the %d tokens" % (name, cu, total))
    return cu


@torch.library.custom_op("ringattn::hf_seqlens", mutates_args=())
def _seqlens(batch: int, seq: int, seq_k: int, position_ids: Optional[torch.Tensor],
             cu_seq_lens_q: Optional[torch.Tensor], cu_seq_lens_k: Optional[torch.Tensor],
             attention_mask: Optional[torch.Tensor], ring_cu: Optional[torch.Tensor],
             ring_positions: Optional[torch.Tensor]) -> List[torch.Tensor]:
    if attention_mask is not None and not bool(attention_mask.all()):
        raise NotImplementedError(
            "ringattn: a padding attention_mask with zeros is not supported; pack the "
            "sequences instead (position_ids restarting at 0, or cu_seq_lens_q/k)")
    if ring_cu is not None:  # a ring: its own boundaries, and checks
        ring_cu = list(rt.host_ints(ring_cu, "ring cu_seqlens"))
        for name, given in (("cu_seq_lens_q", cu_seq_lens_q), ("cu_seq_lens_k", cu_seq_lens_k)):
            given = None if given is None else list(rt.host_ints(given, name))
            if given is not None and given != ring_cu:
                raise ValueError("ringattn: %s %s differs from the ring's global cu_seqlens %s"
                                 % (name, given, ring_cu))
        if position_ids is not None and not torch.equal(
                position_ids.detach().reshape(-1).cpu().long(), ring_positions):
            raise ValueError("ringattn: position_ids are not this rank's positions in the "
                             "ring: pass position_ids=ring.position_ids")
        return [_int32(ring_cu), _int32([])]
    if cu_seq_lens_q is not None:
        return [_int32(_given(cu_seq_lens_q, "cu_seq_lens_q", batch * seq)),
                _int32([] if cu_seq_lens_k is None else
                       _given(cu_seq_lens_k, "cu_seq_lens_k", batch * seq_k))]
    if position_ids is not None:
        return [_cu_from_positions(position_ids, batch, seq), _int32([])]
    # one sequence a row; with a KV cache (seq_k > seq) its queries are the last of its keys
    return [_int32(i * seq for i in range(batch + 1)),
            _int32(i * seq_k for i in range(batch + 1)) if seq_k != seq else _int32([])]


@_seqlens.register_fake
def _seqlens_fake(batch, seq, seq_k, position_ids, cu_seq_lens_q, cu_seq_lens_k,
                  attention_mask, ring_cu, ring_positions):
    if ring_cu is not None:
        n_q, n_k = ring_cu.shape[0], 0
    elif cu_seq_lens_q is not None:
        n_q, n_k = cu_seq_lens_q.shape[0], 0 if cu_seq_lens_k is None else cu_seq_lens_k.shape[0]
    elif position_ids is not None:
        n_q, n_k = batch * seq + 1, 0
    else:
        n_q, n_k = batch + 1, 0 if seq_k == seq else batch + 1
    return [torch.empty(n_q, dtype=torch.int32, device="cpu"),
            torch.empty(n_k, dtype=torch.int32, device="cpu")]


def _refuse(module, attention_mask, dropout, kwargs):
    # a 2D (padding) mask is refused by _seqlens if it holds zeros
    if attention_mask is not None:
        if not (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2):
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
    if position_ids is not None and (position_ids.dim() not in (1, 2) or
                                     position_ids.shape[-1] != s or
                                     position_ids.numel() not in (s, b * s)):
        raise ValueError("ringattn: position_ids of shape %s for a batch of %d rows of %d tokens"
                         % (tuple(position_ids.shape), b, s))
    mask = attention_mask.detach() if attention_mask is not None else None
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
        cu_q, _ = _seqlens(b, s, s_k, position_ids, cu_q_kw, cu_k_kw, mask, ring_._cu_tensor,
                           ring_.positions)
        cu_k, layout, comm = None, ring_.layout, ring_.comm
    else:
        if cu_q_kw is None and cu_k_kw is not None:
            raise ValueError("ringattn: cu_seq_lens_k given without cu_seq_lens_q")
        if cu_q_kw is not None and s_k != s and cu_k_kw is None:
            raise ValueError("ringattn: cu_seq_lens_q without cu_seq_lens_k for %d keys and %d "
                             "queries per row" % (s_k, s))
        if cu_k_kw is not None and cu_k_kw.shape != cu_q_kw.shape:
            raise ValueError("ringattn: cu_seq_lens_k of shape %s for cu_seq_lens_q of shape %s: "
                             "one boundary per query boundary"
                             % (tuple(cu_k_kw.shape), tuple(cu_q_kw.shape)))
        # packing is looked for only when keys and queries are the same tokens (no KV cache)
        cu_q, cu_k = _seqlens(b, s, s_k, position_ids if s_k == s else None, cu_q_kw, cu_k_kw,
                              mask, None, None)
        if cu_k_kw is None and s_k == s:
            cu_k = None
        layout, comm = "contiguous", None

    q = query.transpose(1, 2).reshape(b * s, h, d)
    k = key.transpose(1, 2).reshape(b * s_k, h_kv, d)
    v = value.transpose(1, 2).reshape(b * s_k, h_kv, value.shape[-1])
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out, _ = rt.attention(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=causal, window=window,
                          softcap=0.0 if softcap is None else float(softcap),
                          scale=None if scaling is None else float(scaling),
                          layout=layout, comm=comm, sinks=_sinks(kwargs))
    return out.reshape(b, s, h, out.shape[-1]), None


def _sinks(kwargs):
    """gpt-oss passes its per-head sink logits as s_aux (some models as sinks): SPEC 11."""
    for name in ("s_aux", "sinks"):
        if kwargs.get(name) is not None:
            return kwargs[name].reshape(-1)
    return None


def register():
    """Registers "ringattn" with transformers' AttentionInterface and AttentionMaskInterface
    (idempotent). The mask entry is needed: without one, transformers 5 builds no mask for an
    unknown implementation and would drop a padding mask silently."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_interface)
    return NAME
