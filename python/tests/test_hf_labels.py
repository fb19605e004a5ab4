"""A causal LM's loss in a ring (issue 33, item 3): Ring.shift_labels shifts the GLOBAL labels
once, ends every document, and counts the targets over the whole batch, so that the ranks'
losses (HF's loss with shift_labels= and num_items_in_batch=) add up to the one-process loss,
and their gradients to its gradients. HF's own labels= shifts each rank's shard by itself:
that loss is wrong, which the last test shows."""

import pytest
import torch

import ringattn.hf as hf
import hf_models as M
import ranks

RTOL_LOSS, RTOL_GRAD = 1e-5, 1e-4  # float32, relative (as test_compile.py)


def collator_labels(ids, lengths=M.LENGTHS):
    """The labels of transformers' DataCollatorWithFlattening: the ids, -100 at each
    document's first token, so that HF's shift never pairs two documents."""
    labels = ids.clone()
    labels[0, torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)[:-1]))] = -100
    return labels


def test_shift_labels_on_one_rank():
    ids = torch.arange(10, 15).unsqueeze(0)
    with hf.ring(None, [0, 3, 5], "zigzag") as R:  # one rank: the local rows are all rows
        sl, n = R.shift_labels(ids)
        want = torch.tensor([[11, 12, -100, 14, -100]])
        assert torch.equal(R.unshard(sl), want) and int(n) == 3
        sl1, _ = R.shift_labels(ids[0])  # [T] in, [T_local] out
        assert torch.equal(R.unshard(sl1, dim=0), want[0])
        ignored = ids.clone()
        ignored[0, 1] = -7
        sl, n = R.shift_labels(ignored, ignore_index=-7)
        assert torch.equal(R.unshard(sl), torch.tensor([[-7, 12, -7, 14, -7]])) and int(n) == 2
        with pytest.raises(ValueError, match="labels of shape"):
            R.shift_labels(torch.zeros(2, 5, dtype=torch.long))


def one_process():
    """The reference: one process, HF's labels= on the collator's labels, packed positions."""
    model = M.model("llama")
    ids = M.tokens()
    model.zero_grad(set_to_none=True)
    out = model(ids, position_ids=M.packed_positions(), labels=collator_labels(ids),
                use_cache=False)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def ring_losses(how, P=2):
    """Each rank's loss and gradients in a 2-rank zigzag ring (threads), labels passed `how`."""
    models = [M.model("llama") for _ in range(P)]
    ids = M.tokens()

    def rank(comm, r):
        model = models[r]
        with hf.ring(comm, M.CU, "zigzag") as R:
            if how == "shift_labels":
                sl, n = R.shift_labels(ids)
                kw = dict(labels=sl, shift_labels=sl, num_items_in_batch=n)
            else:  # HF's own: this rank's shard of the one-process labels
                kw = dict(labels=R.shard(collator_labels(ids)))
            out = model(R.shard(ids), position_ids=R.position_ids, use_cache=False, **kw)
            out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    results = ranks.threads(rank, P)
    return [res[0] for res in results], [res[1] for res in results]


def test_ring_loss_with_shift_labels_equals_one_process():
    want, want_grads = one_process()
    losses, grads = ring_losses("shift_labels")
    got = sum(losses)
    print("one process %.6f, ring %s summed %.6f" % (want, [round(x.item(), 6) for x in losses],
                                                     got))
    assert abs(got - want).item() <= RTOL_LOSS * abs(want).item()
    summed = {n: sum(g[n] for g in grads) for n in want_grads}  # gradients add over the ranks
    assert M.max_grad_err(summed, want_grads) <= RTOL_GRAD


def test_ring_loss_with_hfs_own_labels_is_wrong():
    # each rank shifts its own (zigzag, not contiguous) shard: a token's target is whatever
    # token follows it in the shard, and each rank divides by its own count; neither the sum
    # nor the mean of the ranks' losses is the one-process loss
    want, _ = one_process()
    losses, _ = ring_losses("labels")
    total, mean = sum(losses), sum(losses) / len(losses)
    print("one process %.4f; HF's labels= in the ring: ranks %s, mean %.4f, sum %.4f"
          % (want, [round(x.item(), 4) for x in losses], mean, total))
    for wrong in (total, mean):
        assert abs(wrong - want).item() > 1e-3 * abs(want).item()
