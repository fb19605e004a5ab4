"""flash-attn 2's and ring-flash-attn's spellings over ringattn (ringattn.flash_attn_func ...,
ringattn.ring_flash_attn): one rank against PyTorch's float64 attention (SPEC 9), and one 2-rank
run over torch.distributed (gloo) of every ring form, of a training script written for
ring-flash-attn with only its import line changed, and of the Hugging Face substitution."""
import os
import subprocess
import sys

import pytest
import torch

import flash_attn_cases as fc
import ranks
import ringattn
from cases import assert_within, judge, make_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ring_flash_attn_train.py")
SLOPES = [0.5, 0.25, 0.125, 0.0625]
MASKS = {  # reference.py's mask keywords and flash-attn's
    "full": ({}, {}),
    "causal": ({"causal": True}, dict(causal=True)),
    "two_sided_window": ({"window": (6, 3)}, dict(window_size=(6, 3))),
    "causal_window_softcap_alibi": (
        {"causal": True, "window": (5, 0), "softcap": 6.0, "slopes": SLOPES},
        dict(causal=True, window_size=(5, 0), softcap=6.0, alibi_slopes=torch.tensor(SLOPES))),
}


def _grads(out, leaves, dout):
    return dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout)))


def _leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_flash_attn_func_against_float64(mask):
    ref_mask, kw = MASKS[mask]
    b, s = 2, 23
    cu, _, q, k, v, _, dout = make_inputs(11, [s] * b, 4, 2, 16, 16, torch.float32)
    leaves = _leaves(*(t.reshape(b, s, t.shape[1], t.shape[2]) for t in (q, k, v)))
    out, lse, probs = ringattn.flash_attn_func(*leaves, return_attn_probs=True, **kw)
    assert out.shape == (b, s, 4, 16) and lse.shape == (b, 4, s) and probs is None
    assert lse.dtype == torch.float32
    g = _grads(out, leaves, dout.reshape(b, s, 4, 16))
    got = (out.flatten(0, 1).detach(), lse.transpose(0, 1).flatten(1),
           {n: x.flatten(0, 1) for n, x in g.items()})
    assert_within(*judge(q, k, v, None, dout, cu, ref_mask, got), mask)


def test_flash_attn_func_aligns_bottom_right():
    """S_q < S_k (decode, chunked prefill): causal and windows aligned to the last key."""
    b, sq, sk = 2, 5, 17
    cu, cu_k, q, k, v, _, dout = make_inputs(12, [sq] * b, 4, 1, 8, 8, torch.float32,
                                             lengths_k=[sk] * b)
    leaves = [q.reshape(b, sq, 4, 8)] + [t.reshape(b, sk, 1, 8) for t in (k, v)]
    leaves = _leaves(*leaves)
    out = ringattn.flash_attn_func(*leaves, causal=True, window_size=(7, 0))
    g = _grads(out, leaves, dout.reshape(b, sq, 4, 8))
    _, lse, _ = ringattn.flash_attn_func(*leaves, causal=True, window_size=(7, 0),
                                         return_attn_probs=True)
    got = (out.flatten(0, 1).detach(), lse.transpose(0, 1).flatten(1),
           {n: x.flatten(0, 1) for n, x in g.items()})
    assert_within(*judge(q, k, v, None, dout, cu, {"causal": True, "window": (7, -1),
                                                   "cu_k": cu_k}, got))


@pytest.mark.parametrize("mask", ["causal", "causal_window_softcap_alibi"])
def test_flash_attn_varlen_func_against_float64(mask):
    ref_mask, kw = MASKS[mask]
    cu, cu_k, q, k, v, _, dout = make_inputs(13, [9, 1, 30], 4, 2, 16, 16, torch.float32,
                                             lengths_k=[20, 7, 30])
    leaves = _leaves(q, k, v)
    cq, ck = (torch.tensor(c, dtype=torch.int32) for c in (cu, cu_k))
    out, lse, _ = ringattn.flash_attn_varlen_func(*leaves, cq, ck, 30, 30, return_attn_probs=True,
                                                  **kw)
    assert lse.shape == (4, cu[-1])  # flash-attn >= 2.6: [nheads, total_q]
    got = (out.detach(), lse, _grads(out, leaves, dout))
    assert_within(*judge(q, k, v, None, dout, cu, dict(ref_mask, cu_k=cu_k), got), mask)


def test_packed_forms_equal_the_unpacked_ones():
    """qkvpacked / kvpacked: the same outputs, and the gradients land in the packed tensor."""
    cu, _, q, k, v, _, dout = make_inputs(14, [12, 12], 2, 2, 8, 8, torch.float32)
    kw = dict(causal=True, window_size=(4, 0))
    cases = [  # (packed call, unpacked call, packed input, how it splits)
        (lambda x: ringattn.flash_attn_qkvpacked_func(x, **kw),
         lambda a, b_, c: ringattn.flash_attn_func(a, b_, c, **kw),
         torch.stack([q, k, v], 1).reshape(2, 12, 3, 2, 8), lambda x: x.unbind(2)),
        (lambda x: ringattn.flash_attn_varlen_qkvpacked_func(x, torch.tensor(cu), 12, **kw),
         lambda a, b_, c: ringattn.flash_attn_varlen_func(a, b_, c, cu, cu, 12, 12, **kw),
         torch.stack([q, k, v], 1), lambda x: x.unbind(1)),
    ]
    for packed, plain, x, split in cases:
        x = x.clone().requires_grad_()
        out = packed(x)
        (gx,) = torch.autograd.grad(out, [x], dout.reshape(out.shape))
        parts = _leaves(*split(x))
        want = plain(*parts)
        gparts = torch.autograd.grad(want, parts, dout.reshape(out.shape))
        assert torch.equal(out, want) and torch.equal(gx, torch.stack(gparts, x.dim() - 3))
    # kvpacked: kv [.., 2, H_kv, D]
    qb, kvb = q.reshape(2, 12, 2, 8), torch.stack([k, v], 1).reshape(2, 12, 2, 2, 8)
    assert torch.equal(ringattn.flash_attn_kvpacked_func(qb, kvb, **kw),
                       ringattn.flash_attn_func(qb, kvb[:, :, 0], kvb[:, :, 1], **kw))
    kvv = torch.stack([k, v], 1)
    assert torch.equal(ringattn.flash_attn_varlen_kvpacked_func(q, kvv, cu, cu, 12, 12, **kw),
                       ringattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, **kw))


def test_what_flash_attn_has_and_ringattn_refuses():
    q = torch.randn(1, 8, 4, 8)
    f = ringattn.flash_attn_func
    with pytest.raises(NotImplementedError, match="dropout"):
        f(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="block_table"):
        ringattn.flash_attn_varlen_func(q[0], q[0], q[0], [0, 8], [0, 8], 8, 8,
                                        block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="differ between batch rows"):
        f(q, q, q, alibi_slopes=torch.tensor([SLOPES, [0.1] * 4]))
    for bad in (dict(softmax_scale=0.0), dict(window_size=(3,)), dict(window_size=(-2, 0)),
                dict(layout="ring")):
        with pytest.raises(ValueError):
            f(q, q, q, **bad)
    with pytest.raises(ValueError, match="max_seqlen_q=5"):
        ringattn.flash_attn_varlen_func(q[0], q[0], q[0], [0, 8], [0, 8], 5, 8)
    with pytest.raises(ValueError, match="qkv must hold 3"):
        ringattn.flash_attn_qkvpacked_func(torch.randn(1, 8, 2, 4, 8))
    # [B, H] slopes with equal rows are flash-attn's [H]; deterministic is always so
    same = torch.tensor([SLOPES])
    assert torch.equal(f(q, q, q, alibi_slopes=same, deterministic=True),
                       f(q, q, q, alibi_slopes=torch.tensor(SLOPES)))


def test_flash_attn_names_load_torch_lazily():
    # a numpy-only user's `import ringattn` does not import torch ...
    code = ("import sys, ringattn\nassert 'torch' not in sys.modules\n"
            "assert 'flash_attn_varlen_func' in dir(ringattn)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    # ... and the names resolve on first use (PEP 562)
    import ringattn.flash_attn as m
    for name in m.__all__:
        assert getattr(ringattn, name) is getattr(m, name)
    assert ringattn.ring_flash_attn.ring_flash_attn_func.__name__ == "ring_flash_attn_func"
    with pytest.raises(AttributeError):
        ringattn.flash_attn_nothing


def test_llama3_prepare_cu_seqlens():
    """ring-flash-attn's test case (cu_seqlens [0, 7, 14, 16] over 8 ranks), worked by hand."""
    from ringattn.ring_flash_attn import llama3_flash_attn_prepare_cu_seqlens as prepare
    cu = torch.tensor([0, 7, 14, 16], dtype=torch.int32)
    want = {  # rank: causal (cu_q, cu_k, slice), non-causal (cu_k, slice)
        0: ([0, 2], [0, 2], slice(0, 2), [0, 7], slice(0, 7)),
        3: ([0, 1, 2], [0, 7, 8], slice(0, 8), [0, 7, 14], slice(0, 14)),
        4: ([0, 2], [0, 3], slice(7, 10), [0, 7], slice(7, 14)),
        7: ([0, 2], [0, 2], slice(14, 16), [0, 2], slice(14, 16)),
    }
    for rank, (cq, ck, sl, ck_full, sl_full) in want.items():
        got = prepare(cu, True, rank, 8)
        assert got[0].tolist() == cq and got[1].tolist() == ck and got[4] == sl, (rank, got)
        assert got[0].dtype == torch.int32
        assert got[2] == max(b - a for a, b in zip(cq, cq[1:]))
        assert got[3] == max(b - a for a, b in zip(ck, ck[1:]))
        got = prepare(cu, False, rank, 8)
        assert got[1].tolist() == ck_full and got[4] == sl_full, (rank, got)
    with pytest.raises(ValueError, match="equal pieces"):
        prepare(cu, True, 0, 3)


# ---------------------------------------------------------------------------------------------
# Two ranks over gloo, started once

WORLD = 2


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("flash_attn_ring")
    text = open(SCRIPT).read()
    # the only change a ring-flash-attn user makes: the import
    assert text.count("from ring_flash_attn import") == 1
    rewritten = text.replace("from ring_flash_attn import", "from ringattn.ring_flash_attn import")
    script = str(out / "ring_flash_attn_train.py")
    with open(script, "w") as f:
        f.write(rewritten)
    ranks.processes("flash_attn_worker.py", [out, script], WORLD, comm_timeout=30)
    parts = [torch.load(str(out / ("rank%d.pt" % r))) for r in range(WORLD)]
    return {"ranks": parts, "script": torch.load(str(out / "script.pt")), "path": script}


@pytest.mark.parametrize("name", sorted(fc.CASES))
def test_ring_forms_against_float64(ring_run, name):
    cu, q, k, v, dout, mask = fc.inputs(name)
    whole = fc.combine([r["cases"][name] for r in ring_run["ranks"]], cu, q, k, v)
    got = (whole["out"], whole["lse"], {n: whole[n] for n in ("dq", "dk", "dv")})
    assert_within(*judge(q, k, v, None, dout, cu, mask, got), name)


def test_ringattn_layouts_are_ring_flash_attns_token_orders(ring_run):
    for r in ring_run["ranks"]:
        assert all(r["layouts"].values()), r["layouts"]


def test_ring_flash_attn_script_runs_with_only_its_import_changed(ring_run):
    import runpy
    script = runpy.run_path(ring_run["path"], run_name="ring_flash_attn_script")
    for name in script["EXPERIMENTS"]:
        got, want = ring_run["script"][name], script["reference"](name)
        for a, b in zip(got["losses"], want["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), (name, got["losses"], want["losses"])
        for n, g in want["grads"].items():
            e = (got["grads"][n].double() - g).abs().max() / g.abs().max()
            assert e <= 1e-4, (name, n, float(e))


def test_substitute_hf_flash_attn_matches_eager(ring_run):
    err_logits, err_grads = ring_run["ranks"][0]["hf"]
    assert err_logits <= 1e-5 and err_grads <= 1e-4, (err_logits, err_grads)


def test_substitute_hf_flash_attn_registers_and_switches_off():
    """One process: "flash_attention_2" and HF_NAME route to the substituted function, which
    refuses a batch before update_ring_flash_attn_params and, switched off by use_ring_attn,
    runs ringattn's one-rank attention (equal to eager)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import ringattn.ring_flash_attn as rfa
    saved = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    try:
        name = rfa.substitute_hf_flash_attn(None, heads_k_stride=1)
        assert ALL_ATTENTION_FUNCTIONS["flash_attention_2"] is ALL_ATTENTION_FUNCTIONS[name]
        cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        ids = torch.randint(0, 32, (1, 12))
        want = model(ids, use_cache=False).logits
        model.set_attn_implementation(name)
        rfa.DATA_PARAMS.clear()
        with pytest.raises(RuntimeError, match="update_ring_flash_attn_params"):
            model(ids, use_cache=False)
        rfa.use_ring_attn(False)
        got = model(ids, use_cache=False).logits
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    finally:
        rfa.use_ring_attn(True)
        ALL_ATTENTION_FUNCTIONS._local_mapping.clear()
        ALL_ATTENTION_FUNCTIONS._local_mapping.update(saved)
