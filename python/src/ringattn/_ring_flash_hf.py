"""ring-flash-attn's Hugging Face adapter (its ring_flash_attn/adapters/hf_adapter.py) for
transformers 5, over ringattn.ring_flash_attn's llama3 function.

    name = substitute_hf_flash_attn(group, heads_k_stride=1)    # once
    update_ring_flash_attn_params(cu_seqlens, group)             # before each packed batch
    out = model(local_ids, position_ids=local_positions)         # this rank's piece of the stream

ring-flash-attn swaps transformers' flash-attention forward for its llama3 function; in
transformers 5 that is the AttentionInterface entry "flash_attention_2", replaced here for the
models that run it (as ring-flash-attn does), and the same function is registered under
HF_NAME ("ringattn_llama3"), which a model can select without flash-attn installed
(model.set_attn_implementation(name) or attn_implementation=name; transformers refuses
"flash_attention_2" where flash-attn is missing). The model takes one batch row: this rank's
contiguous piece of the global packed batch (cu_seqlens split into P equal pieces, a sequence
may span ranks), position_ids being each token's position in its own sequence (RoPE).

Exact where ring-flash-attn is not: sliding_window w is transformers' own flash convention,
window (w - 1, w - 1) with causal zeroing the right side, applied whatever the local length
(ring-flash-attn's adapter drops it when the LOCAL keys are fewer than w, and gives (w, w));
softcap works (asserted None there); non-causal modules use the non-causal key range. Refused:
padding masks with zeros, dropout > 0, output_attentions, attention sinks, batches of several
rows. use_ring_attn(False) routes the calls to ringattn.hf's one-rank function instead.
"""
import torch
import torch.distributed as dist

HF_NAME = "ringattn_llama3"

# What update_ring_flash_attn_params computed for this rank's next batches (ring-flash-attn's
# module-level DATA_PARAMS, plus the global cu_seqlens and the group they were computed for).
DATA_PARAMS = {}
_switch = [True]


def update_ring_flash_attn_params(cu_seqlens, process_group):
    """Records this rank's llama3 parameters for the global packed batch cu_seqlens (causal, as
    ring-flash-attn; non-causal modules recompute theirs from the stored cu_seqlens)."""
    from .ring_flash_attn import llama3_flash_attn_prepare_cu_seqlens

    world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
    cu_q, cu_k, max_q, max_k, local_k = llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens, True, rank, world)
    cu = cu_seqlens.detach().cpu().tolist() if isinstance(cu_seqlens, torch.Tensor) else list(
        cu_seqlens)
    DATA_PARAMS.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                       max_seqlen_k=max_k, local_k_slice=local_k, cu_seqlens=cu,
                       rank=rank, world_size=world)


def use_ring_attn(flag):
    """False: the substituted attention runs on this rank alone (ringattn.hf's function)."""
    _switch[0] = bool(flag)


def _refuse(attention_mask, kwargs):
    if attention_mask is not None and not (attention_mask.dim() == 2 and
                                           bool(attention_mask.all())):
        raise NotImplementedError(
            "ringattn.ring_flash_attn: a padding or explicit attention mask is not supported; "
            "pack the documents (update_ring_flash_attn_params' cu_seqlens) instead")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("ringattn.ring_flash_attn: output_attentions is not supported")
    for name in ("s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise NotImplementedError("ringattn.ring_flash_attn: attention sinks (%s) are not "
                                      "supported" % name)


def _attention_function(process_group, heads_k_stride):
    from .ring_flash_attn import (llama3_flash_attn_prepare_cu_seqlens,
                                  llama3_flash_attn_varlen_func)

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                  sliding_window=None, softcap=None, is_causal=None, **kwargs):
        """transformers' AttentionInterface function: query [1, H, S_local, D], key/value
        [1, H_kv, S_local, D(_v)] -> ([1, S_local, H, D_v], None)."""
        if not _switch[0]:
            from .hf import attention_forward
            return attention_forward(module, query, key, value, attention_mask, dropout,
                                     scaling, sliding_window, softcap, is_causal, **kwargs)
        _refuse(attention_mask, kwargs)
        if not DATA_PARAMS:
            raise RuntimeError("ringattn.ring_flash_attn: call update_ring_flash_attn_params("
                               "cu_seqlens, group) before the model's forward")
        world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        if (DATA_PARAMS["world_size"], DATA_PARAMS["rank"]) != (world, rank):
            raise ValueError("ringattn.ring_flash_attn: update_ring_flash_attn_params was given "
                             "another group than substitute_hf_flash_attn")
        if query.shape[0] != 1:
            raise ValueError("ringattn.ring_flash_attn: the model takes one batch row (this "
                             "rank's piece of the packed batch), got %d rows" % query.shape[0])
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        if causal:
            params = [DATA_PARAMS[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                               "max_seqlen_k", "local_k_slice")]
        else:  # the keys of each local sequence's whole extent
            params = list(llama3_flash_attn_prepare_cu_seqlens(DATA_PARAMS["cu_seqlens"], False,
                                                               rank, world))
        window = (-1, -1)
        if sliding_window is not None:
            window = (int(sliding_window) - 1, int(sliding_window) - 1)
        q, k, v = (t.transpose(1, 2)[0] for t in (query, key, value))
        out = llama3_flash_attn_varlen_func(
            q, k, v, *params[:4], heads_k_stride, params[4], dropout_p=dropout,
            softmax_scale=scaling, causal=causal, window_size=window, group=process_group,
            softcap=0.0 if softcap is None else float(softcap))
        return out.unsqueeze(0), None

    return attention


def substitute_hf_flash_attn(process_group, heads_k_stride):
    """Routes transformers' flash attention ("flash_attention_2") and the implementation HF_NAME
    to the llama3 ring over process_group; returns HF_NAME."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attention = _attention_function(process_group, heads_k_stride)
    AttentionInterface.register(HF_NAME, attention)
    # flash-attn's mask entry: None unless there is padding, which the function refuses
    AttentionMaskInterface.register(HF_NAME, flash_attention_mask)
    ALL_ATTENTION_FUNCTIONS["flash_attention_2"] = attention
    return HF_NAME
