"""ringattn.hf: the "ringattn" attention implementation of transformers against "eager".

Tiny randomly initialised float32 models (no weights are downloaded): a Llama with GQA and a
Mistral whose sliding window (8) is shorter than the sequence (32). Logits and parameter
gradients of one rank, of packed sequences and of a 2-rank zigzag ring (threads) must equal
eager's; the masks ringattn cannot express must be refused.
"""
import copy
import types

import pytest
import torch

import ranks
import ringattn.hf as hf
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig
from transformers import masking_utils

hf.register()

S = 32
WINDOW = 8
RTOL = 1e-4  # float32: relative to the largest magnitude of the compared tensor


def llama_config(**kw):
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                       max_position_embeddings=256, **kw)


def mistral_config(**kw):
    return MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                         max_position_embeddings=256, sliding_window=WINDOW, **kw)


CONFIGS = {"llama": llama_config, "mistral": mistral_config}


def models(name, **kw):
    """(eager, ringattn): one randomly initialised model and a copy with the same weights."""
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(CONFIGS[name](**kw), attn_implementation="eager",
                                             dtype=torch.float32)
    ring = copy.deepcopy(eager)
    ring.set_attn_implementation("ringattn")
    assert ring.config._attn_implementation == "ringattn"
    return eager, ring


def tokens(shape, seed=1):
    return torch.randint(0, 128, shape, generator=torch.Generator().manual_seed(seed))


def projection(shape, seed=2):
    """A fixed random cotangent for the logits: the loss is (logits * G).sum()."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def run(model, ids, g, **kw):
    # use_cache=False as in training: with a cache, transformers does not look for packed
    # sequences in position_ids (masking_utils._preprocess_mask_arguments)
    model.zero_grad(set_to_none=True)
    logits = model(ids, use_cache=False, **kw).logits
    (logits * g).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def rel_err(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def assert_close(a, b, what, rtol=RTOL):
    err = rel_err(a, b)
    print("%s: max abs error %.3g, relative %.3g" % (what, (a - b).abs().max().item(), err))
    assert err <= rtol, "%s: max abs error %.3g, relative %.3g" % (
        what, (a - b).abs().max().item(), err)


def assert_grads_close(ga, gb, what, rtol=RTOL):
    assert ga.keys() == gb.keys()
    for n in gb:
        assert_close(ga[n], gb[n], "%s grad %s" % (what, n), rtol)


def packed_positions(lengths):
    return torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)


# --------------------------------------------------------------------------------------------


def test_register_is_idempotent_and_from_config_works():
    from transformers import AttentionInterface

    assert hf.register() == "ringattn"
    assert hf.register() == "ringattn"
    assert AttentionInterface._global_mapping["ringattn"] is hf.attention_forward
    assert masking_utils.AttentionMaskInterface._global_mapping["ringattn"] is hf.mask_interface
    m = AutoModelForCausalLM.from_config(llama_config(), attn_implementation="ringattn")
    assert m.config._attn_implementation == "ringattn"


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_one_rank_matches_eager(name):
    eager, ring = models(name)
    ids, g = tokens((1, S)), projection((1, S, 128))
    la, ga = run(eager, ids, g)
    lb, gb = run(ring, ids, g)
    assert_close(lb, la, name + " logits")
    assert_grads_close(gb, ga, name)


def test_batch_rows_match_eager():
    eager, ring = models("mistral")
    ids, g = tokens((2, S)), projection((2, S, 128))
    la, ga = run(eager, ids, g)
    lb, gb = run(ring, ids, g)
    assert_close(lb, la, "batch of 2 logits")
    assert_grads_close(gb, ga, "batch of 2")


def window_key_counts(window, length):
    """How many keys each query of one sequence attends to, read off ringattn's output:
    q = 0 gives uniform weights over the allowed keys and v = one-hot of the key position."""
    module = types.SimpleNamespace(is_causal=True, config=None, training=False)
    q = torch.zeros(1, 1, length, 4)
    k = torch.zeros(1, 1, length, 4)
    v = torch.eye(length).reshape(1, 1, length, length)
    out, _ = hf.attention_forward(module, q, k, v, None, scaling=1.0, sliding_window=window)
    return (out[0, :, 0, :] > 0).sum(-1)


def test_sliding_window_width_is_hfs():
    # transformers' eager/sdpa mask for sliding_window = w (Mistral) keeps w keys: q-w+1 .. q
    mask = masking_utils.sdpa_mask(batch_size=1, q_length=S, kv_length=S,
                                   mask_function=masking_utils.sliding_window_causal_mask_function(WINDOW),
                                   allow_is_causal_skip=False)
    hf_counts = mask[0, 0].sum(-1)
    assert hf_counts.max().item() == WINDOW
    assert torch.equal(window_key_counts(WINDOW, S), hf_counts)
    assert torch.equal(window_key_counts(WINDOW, S),
                       torch.clamp(torch.arange(S) + 1, max=WINDOW))


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_packed_rows_equal_separate_runs(name):
    eager, ring = models(name)
    lengths = (20, 12)
    ids, g = tokens((1, S)), projection((1, S, 128))
    lp, gp = run(ring, ids, g, position_ids=packed_positions(lengths))
    start, sep_grads = 0, None
    for n in lengths:
        sl = slice(start, start + n)
        ls, gs = run(ring, ids[:, sl], g[:, sl])
        le, _ = run(eager, ids[:, sl], g[:, sl])
        assert_close(lp[:, sl], ls, "%s packed vs separate logits [%d:%d]" % (name, sl.start, sl.stop))
        assert_close(lp[:, sl], le, "%s packed vs separate eager [%d:%d]" % (name, sl.start, sl.stop))
        sep_grads = gs if sep_grads is None else {k: sep_grads[k] + gs[k] for k in gs}
        start += n
    assert_grads_close(gp, sep_grads, name + " packed vs separate")
    # the eager model's own packed mask (found from the same position_ids) agrees too
    le, ge = run(eager, ids, g, position_ids=packed_positions(lengths))
    assert_close(lp, le, name + " packed logits vs eager packed")
    assert_grads_close(gp, ge, name + " packed vs eager packed")


def test_cu_seq_lens_kwargs():
    # cu_seq_lens_q/k (as for HF's flash path) split the row even where position_ids do not
    # restart: document 2 then has positions 20..31, as in eager on that slice with them
    eager, ring = models("mistral")
    ids, g = tokens((1, S)), projection((1, S, 128))
    cu = torch.tensor([0, 20, S], dtype=torch.int32)
    lp, _ = run(ring, ids, g, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20, max_length_k=20)
    for a, b in ((0, 20), (20, S)):
        le, _ = run(eager, ids[:, a:b], g[:, a:b], position_ids=torch.arange(a, b).unsqueeze(0))
        assert_close(lp[:, a:b], le, "cu_seq_lens logits [%d:%d]" % (a, b))


def test_kv_cache_decoding_matches_eager():
    # a prompt of 12 (longer than the window) then 3 tokens one at a time on a DynamicCache:
    # keys outnumber queries, bottom-right aligned; Mistral's cache keeps the window only
    eager, ring = models("mistral")
    ids = tokens((1, 15))
    outs = []
    for m in (eager, ring):
        with torch.no_grad():
            out = m(ids[:, :12], use_cache=True)
            logits = [out.logits]
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            for t in range(12, 15):
                out = m(ids[:, t:t + 1], cache=cache, use_cache=True)
                logits.append(out.logits)
        outs.append(torch.cat(logits, 1))
    assert_close(outs[1], outs[0], "cached decoding logits")


def test_softcap_scaling_gqa_direct():
    # Gemma 2's eager attention (softcap on the scaled logits) against ringattn's, with GQA
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    torch.manual_seed(3)
    b, h, h_kv, s, d = 1, 4, 2, 24, 16
    q = torch.randn(b, h, s, d, requires_grad=True)
    k = torch.randn(b, h_kv, s, d, requires_grad=True)
    v = torch.randn(b, h_kv, s, d, requires_grad=True)
    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=h // h_kv,
                                   training=False, config=None)
    mask = masking_utils.eager_mask(batch_size=1, q_length=s, kv_length=s,
                                    mask_function=masking_utils.sliding_window_causal_mask_function(6),
                                    dtype=torch.float32)
    go = torch.randn(b, s, h, d)
    results = []
    for fn, m in ((eager_attention_forward, mask), (hf.attention_forward, None)):
        out, _ = fn(module, q, k, v, m, scaling=0.3, softcap=2.5, sliding_window=6)
        grads = torch.autograd.grad((out * go).sum(), (q, k, v))
        results.append((out.detach(), grads))
    (oe, ge), (orr, gr) = results
    assert_close(orr, oe, "softcap output")
    for x, y, n in zip(gr, ge, "qkv"):
        assert_close(x, y, "softcap d" + n)


@pytest.mark.parametrize("how", ["module", "keyword"])
def test_non_causal_direct(how):
    # module.is_causal False (or the is_causal keyword, which wins) is full attention
    from transformers.models.llama.modeling_llama import eager_attention_forward

    torch.manual_seed(4)
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    module = types.SimpleNamespace(is_causal=how == "keyword", num_key_value_groups=2,
                                   training=False, config=None)
    kw = {"is_causal": False} if how == "keyword" else {}
    oe, _ = eager_attention_forward(module, q, k, v, None, scaling=0.35)
    orr, _ = hf.attention_forward(module, q, k, v, None, scaling=0.35, **kw)
    assert_close(orr, oe, "non-causal output (%s)" % how)


def test_direct_refusals():
    module = types.SimpleNamespace(is_causal=True, config=None, training=False)
    q = k = v = torch.randn(1, 2, 8, 4)
    with pytest.raises(NotImplementedError, match="bidirectional sliding window"):
        hf.attention_forward(module, q, k, v, None, sliding_window=4, is_causal=False)
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        hf.attention_forward(module, q, k, v, None, sliding_window=0)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        hf.attention_forward(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 3, 7]))
    with pytest.raises(NotImplementedError, match="dropout"):
        hf.attention_forward(module, q, k, v, None, dropout=0.1)


# --------------------------------------------------------------------------------------------
# two ranks: threads of this process, a zigzag ring over two packed documents


def run_ring(models_per_rank, ids, g, cu, layout="zigzag", mechanism="context"):
    def step(model, R, **kw):
        model.zero_grad(set_to_none=True)
        logits = model(R.shard(ids), position_ids=R.position_ids, use_cache=False, **kw).logits
        (logits * R.shard(g)).sum().backward()
        return (R.unshard(logits.detach()),
                {n: p.grad.clone() for n, p in model.named_parameters()})

    def rank(comm, r):
        if mechanism == "context":  # a thread-local context
            with hf.ring(comm, cu, layout) as R:
                return step(models_per_rank[r], R)
        # the Ring passed through the model's keywords, which gradient checkpointing keeps
        # for its recomputation in the backward
        model = models_per_rank[r]
        getattr(model, "activation_checkpointing_enable",
                getattr(model, "gradient_checkpointing_enable", None))()
        model.train()
        R = hf.Ring(comm, cu, layout)
        assert hf.current_ring() is None
        return step(model, R, ringattn_ring=R)

    results = ranks.threads(rank, len(models_per_rank))
    logits = sum(res[0] for res in results)
    grads = {n: sum(res[1][n] for res in results) for n in results[0][1]}
    return logits, grads


@pytest.mark.parametrize("name,mechanism", [("llama", "context"), ("mistral", "context"),
                                            ("mistral", "keyword")])
def test_two_rank_ring_matches_eager(name, mechanism):
    # two documents (20 and 12 tokens) in one row, zigzag over 2 ranks: each rank holds pieces
    # of both; Mistral's window of 8 crosses the shard boundaries
    eager, ring = models(name)
    lengths = (20, 12)
    cu = [0, 20, S]
    ids, g = tokens((1, S)), projection((1, S, 128))
    le, ge = run(eager, ids, g, position_ids=packed_positions(lengths))
    logits, grads = run_ring([ring, copy.deepcopy(ring)], ids, g, cu, mechanism=mechanism)
    assert_close(logits, le, "%s ring (%s) logits" % (name, mechanism))
    assert_grads_close(grads, ge, "%s ring (%s)" % (name, mechanism))


# --------------------------------------------------------------------------------------------
# refusals


def test_padding_mask_is_refused_and_all_ones_accepted():
    eager, ring = models("llama")
    ids = tokens((2, S))
    mask = torch.ones(2, S, dtype=torch.long)
    with torch.no_grad():
        assert_close(ring(ids, attention_mask=mask).logits, eager(ids).logits, "all-ones mask")
        mask[1, :5] = 0
        with pytest.raises(NotImplementedError, match="padding attention_mask"):
            ring(ids, attention_mask=mask)


def test_4d_mask_is_refused():
    _, ring = models("llama")
    mask = torch.zeros(1, 1, S, S)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="explicit attention mask"):
        ring(tokens((1, S)), attention_mask=mask)


def test_dropout_in_training_is_refused():
    _, ring = models("llama", attention_dropout=0.1)
    ring.train()
    with pytest.raises(NotImplementedError, match="dropout"):
        ring(tokens((1, S)))
    ring.eval()  # no dropout in eval: fine
    with torch.no_grad():
        ring(tokens((1, S)))


def test_output_attentions_is_refused():
    _, ring = models("llama")
    with torch.no_grad(), pytest.raises(NotImplementedError, match="output_attentions"):
        ring(tokens((1, S)), output_attentions=True)


def test_mask_overlays_and_static_cache_slots_are_refused():
    mu = masking_utils
    extra = lambda b, h, q, kv: q >= 0  # noqa: E731 (a custom overlay)
    for fn in (mu.or_masks(mu.causal_mask_function, extra),
               mu.and_masks(mu.causal_mask_function, extra),
               mu.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long)),
               mu.sliding_window_bidirectional_mask_function(4)):
        with pytest.raises(NotImplementedError, match="cannot express"):
            hf.mask_interface(1, S, S, mask_function=fn)
    assert hf.mask_interface(1, S, S, mask_function=mu.sliding_window_causal_mask_function(4)) is None
    with pytest.raises(NotImplementedError, match="static cache"):
        hf.mask_interface(1, 1, 64, q_offset=10, kv_offset=0, mask_function=mu.causal_mask_function)
    # a full mask over other keys (cross-attention) is fine; a padded one goes to the refusal
    assert hf.mask_interface(1, 4, 16, mask_function=mu.bidirectional_mask_function) is None
    pad = torch.ones(1, 16, dtype=torch.bool)
    pad[0, 3] = False
    assert hf.mask_interface(1, 4, 16, mask_function=mu.bidirectional_mask_function,
                             attention_mask=pad) is not None


def test_ring_refusals():
    # a one-rank ring (comm None) checks the same things a P-rank one does
    _, ring = models("llama")
    with torch.no_grad(), hf.ring(None, [0, S], "zigzag") as R:
        with pytest.raises(ValueError, match="batch of 2 rows"):
            ring(tokens((2, S)), position_ids=R.position_ids)
        with pytest.raises(ValueError, match="holds 32 tokens"):
            ring(tokens((1, S // 2)))
        with pytest.raises(ValueError, match="position_ids"):
            ring(tokens((1, S)), position_ids=torch.zeros(1, S, dtype=torch.long))
        ring(tokens((1, S)), position_ids=R.position_ids)
    assert hf.current_ring() is None
