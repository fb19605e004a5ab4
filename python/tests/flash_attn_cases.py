"""Ring cases of the flash-attn / ring-flash-attn compatible API, shared by the rank processes
(flash_attn_worker.py runs them) and the test that judges them (test_flash_attn.py).

Every case builds the same global packed inputs from a seed (cases.make_inputs), cuts this rank's
shard by the convention of the API under test -- global_rows(), written from ring-flash-attn's
tests' extract_local, not from ringattn's ShardPlan -- calls the API on it and returns its local
out, lse [H, local rows] and gradients with the global rows they belong to.
"""
import torch

from cases import make_inputs

H, HKV, D = 4, 2, 16
SLOPES = [0.5, 0.25, 0.125, 0.0625]

# name: (api, family or layout, global sequence lengths (a batch: B equal ones), reference mask,
#        the API's keywords)
CASES = {
    "ring_func": ("rfa_func", "ring", [20, 20], {"causal": True, "window": (6, 0)},
                  dict(causal=True, window_size=(6, 0))),
    # zigzag and stripe with masks ring-flash-attn asserts against (non-causal, ALiBi, windows)
    "zigzag_func": ("rfa_func", "zigzag", [20, 20], {"window": (3, 5), "slopes": SLOPES},
                    dict(window_size=(3, 5), alibi_slopes=torch.tensor(SLOPES))),
    "stripe_func": ("rfa_func", "stripe", [20, 20],
                    {"causal": True, "window": (4, 0), "softcap": 5.0},
                    dict(causal=True, window_size=(4, 0), softcap=5.0)),
    "ring_varlen": ("rfa_varlen", "ring", [12, 8, 16], {"causal": True, "window": (5, 0)},
                    dict(causal=True, window_size=(5, 0))),
    "zigzag_varlen": ("rfa_varlen", "zigzag", [12, 8, 16], {"window": (2, 3)},
                      dict(window_size=(2, 3))),
    "stripe_varlen": ("rfa_varlen", "stripe", [12, 8, 16], {"causal": True, "slopes": SLOPES},
                      dict(causal=True, alibi_slopes=torch.tensor(SLOPES))),
    "llama3_causal": ("llama3", "llama3", [13, 17, 6],
                      {"causal": True, "window": (7, 0), "slopes": SLOPES},
                      dict(causal=True, window_size=(7, 0), alibi_slopes=torch.tensor(SLOPES))),
    # not causal: keys past a rank's queries, the queries' true positions (padded rows)
    "llama3_window": ("llama3", "llama3", [13, 17, 6], {"window": (3, 4)},
                      dict(window_size=(3, 4))),
    # ringattn's own spellings: group= and layout=, global cu_seqlens for varlen
    "fa_func_contiguous": ("fa_func", "contiguous", [20, 20],
                           {"causal": True, "window": (5, 0), "softcap": 8.0, "slopes": SLOPES},
                           dict(causal=True, window_size=(5, 0), softcap=8.0,
                                alibi_slopes=torch.tensor(SLOPES))),
    "fa_func_zigzag": ("fa_func", "zigzag", [20, 20], {"causal": True}, dict(causal=True)),
    "fa_func_striped": ("fa_func", "striped", [20, 20], {"window": (4, 2)},
                        dict(window_size=(4, 2))),
    "fa_varlen_zigzag": ("fa_varlen", "zigzag", [13, 18], {"window": (4, 2)},
                         dict(window_size=(4, 2))),
    "fa_varlen_striped": ("fa_varlen", "striped", [13, 18], {"causal": True}, dict(causal=True)),
}

LAYOUT_OF = {"ring": "contiguous", "zigzag": "zigzag", "stripe": "striped",
             "contiguous": "contiguous", "striped": "striped"}


def inputs(name):
    _, _, lengths, mask, _ = CASES[name]
    cu, _, q, k, v, _, dout = make_inputs(sum(map(ord, name)), lengths, H, HKV, D, D,
                                          torch.float32)
    return cu, q, k, v, dout, mask


def global_rows(family, cu, rank, world):
    """This rank's rows of the global packed batch, in local order (ring-flash-attn's tests:
    chunk(P)[r]; chunks r and 2P-1-r of chunk(2P); r::P; llama3: the r-th of P pieces)."""
    if family == "llama3":
        n = cu[-1] // world
        return torch.arange(rank * n, (rank + 1) * n)
    rows = []
    for start, end in zip(cu[:-1], cu[1:]):
        idx = torch.arange(start, end)
        if family in ("ring", "contiguous"):
            rows.append(idx.chunk(world)[rank])
        elif family == "zigzag":
            chunks = idx.chunk(2 * world)
            rows += [chunks[rank], chunks[2 * world - 1 - rank]]
        else:
            rows.append(idx[rank::world])
    return torch.cat(rows)


def _call(name, q, k, v, cu, rank, world, group):
    """The API of case `name` on this rank's q, k, v [rows, heads, D] -> (out, lse [H, rows])."""
    import ringattn
    import ringattn.ring_flash_attn as rfa

    api, family, lengths, _, kw = CASES[name]
    kw = dict(kw, return_attn_probs=True)
    if api.startswith("fa_") and group is None:  # ringattn's group None is one rank
        import torch.distributed as dist
        group = dist.group.WORLD
    if api in ("rfa_func", "fa_func"):  # batch rows of equal length
        b = len(lengths)
        q, k, v = (t.reshape(b, -1, t.shape[1], t.shape[2]) for t in (q, k, v))
        if api == "rfa_func":
            fn = {"ring": rfa.ring_flash_attn_func, "zigzag": rfa.zigzag_ring_flash_attn_func,
                  "stripe": rfa.stripe_flash_attn_func}[family]
            out, lse, _ = fn(q, k, v, group=group, **kw)
        else:
            out, lse, _ = ringattn.flash_attn_func(q, k, v, group=group, layout=family, **kw)
        # [B, H, S_local] -> [H, B * S_local], the local rows' order
        return out.flatten(0, 1), lse.transpose(0, 1).flatten(1)
    if api == "rfa_varlen":
        fn = {"ring": rfa.ring_flash_attn_varlen_func,
              "zigzag": rfa.zigzag_ring_flash_attn_varlen_func,
              "stripe": rfa.stripe_flash_attn_varlen_func}[family]
        local_cu = torch.tensor(cu, dtype=torch.int32) // world
        out, lse, _ = fn(q, k, v, local_cu, int(local_cu.diff().max()), group=group, **kw)
        return out, lse
    if api == "fa_varlen":
        cu_t = torch.tensor(cu, dtype=torch.int32)
        out, lse, _ = ringattn.flash_attn_varlen_func(q, k, v, cu_t, cu_t, max(lengths),
                                                      max(lengths), group=group, layout=family,
                                                      **kw)
        return out, lse
    causal = kw.get("causal", False)
    cu_q, cu_k, max_q, max_k, local_k = rfa.llama3_flash_attn_prepare_cu_seqlens(
        torch.tensor(cu, dtype=torch.int32), causal, rank, world)
    out, lse, _ = rfa.llama3_flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, 1,
                                                    local_k, group=group, **kw)
    return out, lse


def shard_plan(cu, layout, group):
    import torch.distributed as dist
    import ringattn.torch as rt
    from ringattn.flash_attn import group_comm

    comm = group_comm(dist.group.WORLD if group is None else group, "cpu")
    return rt.plan(cu, layout=LAYOUT_OF[layout], comm=comm)


def run_rank(name, rank, world, group=None):
    """This rank's part of case `name`: {rows, out, lse, dq, dk, dv} (local rows)."""
    cu, q, k, v, dout, _ = inputs(name)
    api, family = CASES[name][:2]
    if api == "fa_varlen":  # ringattn's own varlen shards: SPEC 8's, as ringattn.torch.plan says
        rows = shard_plan(cu, family, group).index
    else:
        rows = global_rows(family, cu, rank, world)
    local = [t[rows].detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = _call(name, *local, cu, rank, world, group)
    dq, dk, dv = torch.autograd.grad(out, local, dout[rows])
    return {"rows": rows, "out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def combine(parts, cu, q, k, v):
    """The ranks' pieces in their global rows: {out, lse, dq, dk, dv}."""
    whole = {"out": torch.zeros(q.shape[0], H, v.shape[2]), "lse": torch.zeros(H, q.shape[0]),
             "dq": torch.zeros_like(q), "dk": torch.zeros_like(k), "dv": torch.zeros_like(v)}
    for p in parts:
        for n in ("out", "dq", "dk", "dv"):
            whole[n][p["rows"]] = p[n]
        whole["lse"][:, p["rows"]] = p["lse"]
    return whole
