"""Tiny random-weight HF causal LMs (float32, 2 layers, no download) and how the compile and
labels tests run them: Llama (GQA), Gemma 2 (a sliding-window layer and a full one, attention
logit softcap) and Qwen 2 (a full layer and a sliding-window one)."""
import torch

import ringattn.hf as hf
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, Qwen2Config

hf.register()

S = 32
VOCAB = 128
WINDOW = 8
LENGTHS = (13, 11, 8)  # three documents packed in one row of S tokens
CU = [0, 13, 24, 32]

_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
               max_position_embeddings=256)
CONFIGS = {
    "llama": lambda: LlamaConfig(**_COMMON),
    "gemma2": lambda: Gemma2Config(**_COMMON, head_dim=16, query_pre_attn_scalar=16,
                                   sliding_window=WINDOW, attn_logit_softcapping=4.0,
                                   final_logit_softcapping=30.0,
                                   layer_types=["sliding_attention", "full_attention"]),
    "qwen2": lambda: Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=WINDOW,
                                 max_window_layers=1),
}


def model(name, attn="ringattn"):
    """The model `name` with seed-0 weights (the same in every process) and `attn`."""
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation=attn,
                                         dtype=torch.float32)
    assert m.config._attn_implementation == attn
    return m


def tokens(shape=(1, S), seed=1):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def projection(shape=(1, S, VOCAB), seed=2):
    """A fixed random cotangent for the logits: the loss is (logits * G).sum()."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def packed_positions(lengths=LENGTHS):
    return torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)


def run(m, ids, g, **kw):
    """(logits, {parameter: gradient}) of (logits * g).sum(); use_cache=False as in training."""
    m.zero_grad(set_to_none=True)
    logits = m(ids, use_cache=False, **kw).logits
    (logits * g).sum().backward()
    params = getattr(m, "_orig_mod", m).named_parameters()  # torch.compile's wrapper: its model
    return logits.detach(), {n: p.grad.clone() for n, p in params}


def rel_err(a, b):
    """max |a - b| relative to max |b| (the norm of test_hf.py)."""
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def assert_close(a, b, what, rtol):
    err = rel_err(a, b)
    print("%s: max abs error %.3g, relative %.3g" % (what, (a - b).abs().max().item(), err))
    assert err <= rtol, "%s: relative error %.3g > %g" % (what, err, rtol)


def max_grad_err(ga, gb):
    assert ga.keys() == gb.keys()
    return max(rel_err(ga[n], gb[n]) for n in gb)
