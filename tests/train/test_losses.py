import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from train.losses import chunked_soft_kl, eagle1_loss, eagle3_ttt_loss, medusa_loss, project_target


def _reference_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask):
    """Unchunked: mean over masked rows of KL(target || draft), autograd all the way."""
    target_logprobs = F.log_softmax(target_hidden @ target_weight.T, dim=-1)
    draft_logprobs = F.log_softmax(draft_hidden @ draft_weight.T, dim=-1)
    kl_rows = (target_logprobs.exp() * (target_logprobs - draft_logprobs)).sum(-1)
    return (kl_rows * mask).sum() / mask.sum()


def _inputs(rows=13, hidden=8, vocab=11, seed=0):
    generator = torch.Generator().manual_seed(seed)
    draft_hidden = torch.randn(rows, hidden, generator=generator, requires_grad=True)
    draft_weight = torch.randn(vocab, hidden, generator=generator, requires_grad=True)
    target_hidden = torch.randn(rows, hidden, generator=generator)
    target_weight = torch.randn(vocab, hidden, generator=generator)
    mask = (torch.rand(rows, generator=generator) > 0.3).float()
    return draft_hidden, draft_weight, target_hidden, target_weight, mask


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 64])
def test_chunked_kl_equals_the_unchunked_reference_in_value_and_gradient(chunk_size):
    draft_hidden, draft_weight, target_hidden, target_weight, mask = _inputs()
    expected = _reference_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask)
    expected_grads = torch.autograd.grad(expected * 3, (draft_hidden, draft_weight))

    result = chunked_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask, chunk_size)
    grads = torch.autograd.grad(result.loss * 3, (draft_hidden, draft_weight))  # upstream scale reaches both
    torch.testing.assert_close(result.loss, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)
    assert result.tokens == mask.sum()
    assert torch.equal(result.draft_argmax, (draft_hidden @ draft_weight.T).argmax(-1))
    assert torch.equal(result.target_argmax, (target_hidden @ target_weight.T).argmax(-1))


def test_the_graph_keeps_no_logits_sized_tensor():
    rows, hidden, vocab, chunk = 64, 4, 512, 8  # one chunk of logits (4096) outsizes every input
    draft_hidden, draft_weight, target_hidden, target_weight, mask = _inputs(rows, hidden, vocab)
    saved_sizes = []

    def record(tensor):
        saved_sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(record, lambda tensor: tensor):
        result = chunked_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask, chunk)
    assert saved_sizes, "the loss saved nothing for its backward"
    assert max(saved_sizes) <= max(rows * hidden, vocab * hidden)  # the gradients of the inputs, no more
    assert max(saved_sizes) < chunk * vocab and sum(saved_sizes) < rows * vocab
    result.loss.backward()
    assert draft_hidden.grad is not None and draft_weight.grad is not None


def test_no_gradients_are_built_without_grad_mode():
    draft_hidden, draft_weight, target_hidden, target_weight, mask = _inputs()
    with torch.no_grad():
        result = chunked_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask, 4)
    assert not result.loss.requires_grad


def test_rows_outside_the_mask_cannot_poison_the_loss():
    draft_hidden, draft_weight, target_hidden, target_weight, _ = _inputs()
    mask = torch.zeros(13)
    mask[:4] = 1
    poisoned = draft_hidden.detach().clone()
    poisoned[4:] = float("nan")
    poisoned.requires_grad_()
    result = chunked_soft_kl(poisoned, draft_weight, target_hidden, target_weight, mask, 3)
    result.loss.backward()
    assert torch.isfinite(result.loss) and torch.isfinite(draft_weight.grad).all()
    empty = chunked_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, torch.zeros(13), 3)
    assert empty.loss == 0 and empty.tokens == 0


def test_one_full_vocab_projection_gives_draft_vocab_logprobs_outside_mass_and_argmax():
    target_hidden, target_lm_head = torch.randn(6, 4), torch.randn(10, 4)
    draft_token_ids = torch.tensor([0, 3, 4])
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[draft_token_ids] = True
    target = project_target(target_hidden, target_lm_head, draft_token_ids)
    logits = target_hidden @ target_lm_head.T
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(target.outside_mass, probs[:, ~t2d].sum(-1))
    assert torch.equal(target.argmax, probs.argmax(-1))
    torch.testing.assert_close(target.logprobs, F.log_softmax(logits[:, draft_token_ids], -1))


def _token_batch(batch=2, seq=9, hidden=8, vocab=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    target_final_hidden = torch.randn(batch, seq, hidden, generator=generator)
    target_lm_head = torch.randn(vocab, hidden, generator=generator)
    loss_mask = (torch.rand(batch, seq, generator=generator) > 0.2).long()
    return target_final_hidden, target_lm_head, loss_mask


def test_ttt_loss_pairs_each_step_with_the_right_target_row():
    """Row t of step k is scored against the target at t + k + 1, masked by loss_mask[t + k + 2]."""
    target_final_hidden, target_lm_head, loss_mask = _token_batch()
    batch, seq, hidden = target_final_hidden.shape
    draft_token_ids = torch.tensor([0, 2, 3, 5, 7, 8, 11, 12, 13, 19])
    draft_lm_head = torch.randn(len(draft_token_ids), hidden, requires_grad=True)
    steps = [torch.randn(batch, seq, hidden, requires_grad=True) for _ in range(3)]
    result = eagle3_ttt_loss(
        steps, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask, chunk_size=5
    )

    step_losses, step_accuracy = [], []
    for k, states in enumerate(steps):
        terms, correct, count = [], [], 0
        for b in range(batch):
            for t in range(seq - k - 2):
                if not loss_mask[b, t + k + 2]:
                    continue
                target_logits = target_lm_head @ target_final_hidden[b, t + k + 1]
                target_probs = torch.softmax(
                    target_logits[draft_token_ids], -1
                )  # renormalised over the draft vocab
                draft_logprobs = F.log_softmax(draft_lm_head @ states[b, t], -1)
                terms.append((target_probs * (target_probs.log() - draft_logprobs)).sum())
                correct.append(draft_token_ids[draft_logprobs.argmax()] == target_logits.argmax())
                count += 1
        step_losses.append(torch.stack(terms).mean())
        step_accuracy.append(torch.stack(correct).float().mean())
        assert result.step_tokens[k] == count
    expected = sum(0.8**k * loss for k, loss in enumerate(step_losses))
    torch.testing.assert_close(result.step_losses, torch.stack(step_losses))
    torch.testing.assert_close(result.step_accuracy, torch.stack(step_accuracy))
    torch.testing.assert_close(result.loss, expected)
    grads = torch.autograd.grad(result.loss, [*steps, draft_lm_head])
    expected_grads = torch.autograd.grad(expected, [*steps, draft_lm_head])
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)

    step0_mask = loss_mask[:, 2:].bool()
    probs = torch.softmax(target_final_hidden[:, 1:-1] @ target_lm_head.T, -1)
    t2d = torch.zeros(20, dtype=torch.bool)
    t2d[draft_token_ids] = True
    torch.testing.assert_close(result.outside_mass, probs[..., ~t2d].sum(-1)[step0_mask].mean())
    torch.testing.assert_close(result.argmax_coverage, t2d[probs.argmax(-1)][step0_mask].float().mean())


def _per_step_ttt_loss(
    steps, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask, chunk
):
    """The formula before target sharing: one chunked_soft_kl per step (each projecting the target
    itself) and a separate full-vocab pass for the argmax and the outside mass."""
    seq = loss_mask.shape[1]
    hidden = target_final_hidden.shape[-1]
    full_logits = target_final_hidden[:, 1:-1].reshape(-1, hidden) @ target_lm_head.T  # [B * (T - 2), V]
    full_argmax = full_logits.argmax(-1).view(-1, seq - 2)
    t2d = torch.zeros(target_lm_head.shape[0], dtype=torch.bool)
    t2d[draft_token_ids] = True
    total, step_losses, step_accuracy, step_tokens = 0, [], [], []
    for k, states in enumerate(steps):
        length = seq - k - 2
        mask = loss_mask[:, k + 2 :].reshape(-1).bool()
        kl = chunked_soft_kl(
            states[:, :length].reshape(-1, states.shape[-1]),
            draft_lm_head,
            target_final_hidden[:, k + 1 : k + 1 + length].reshape(-1, hidden),
            target_lm_head[draft_token_ids],
            mask,
            chunk,
        )
        correct = draft_token_ids[kl.draft_argmax] == full_argmax[:, k:].reshape(-1)
        total = total + 0.8**k * kl.loss
        step_losses.append(kl.loss)
        step_accuracy.append(correct[mask].float().mean())
        step_tokens.append(kl.tokens)
    step0_mask = loss_mask[:, 2:].reshape(-1).bool()
    outside_mass = torch.softmax(full_logits, -1)[:, ~t2d].sum(-1)[step0_mask].mean()
    coverage = t2d[full_argmax.reshape(-1)][step0_mask].float().mean()
    return (
        total,
        torch.stack(step_losses),
        torch.stack(step_accuracy),
        torch.stack(step_tokens),
        outside_mass,
        coverage,
    )


def _ttt_inputs(batch=3, seq=11, hidden=6, vocab=40, draft_vocab=17, steps=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    target_final_hidden, target_lm_head, loss_mask = _token_batch(batch, seq, hidden, vocab, seed)
    draft_token_ids = torch.randperm(vocab, generator=generator)[:draft_vocab].sort().values
    draft_lm_head = torch.randn(draft_vocab, hidden, generator=generator, requires_grad=True)
    states = [torch.randn(batch, seq, hidden, generator=generator, requires_grad=True) for _ in range(steps)]
    return states, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask


@pytest.mark.parametrize("chunk_size", [1, 4, 9, 27, 1000])  # 27 = B * (T - 2): one chunk
@pytest.mark.parametrize("seed,draft_vocab", [(0, 17), (1, 40)])  # 40: the full vocab
def test_shared_target_path_equals_the_per_step_formula(chunk_size, seed, draft_vocab):
    inputs = _ttt_inputs(draft_vocab=draft_vocab, seed=seed)
    states, draft_lm_head = inputs[0], inputs[1]
    result = eagle3_ttt_loss(*inputs, chunk_size=chunk_size)
    total, step_losses, step_accuracy, step_tokens, outside_mass, coverage = _per_step_ttt_loss(
        *inputs, chunk_size
    )
    torch.testing.assert_close(result.loss, total)
    torch.testing.assert_close(result.step_losses, step_losses)
    torch.testing.assert_close(result.step_accuracy, step_accuracy)
    assert torch.equal(result.step_tokens, step_tokens)
    torch.testing.assert_close(result.outside_mass, outside_mass)
    torch.testing.assert_close(result.argmax_coverage, coverage)
    grads = torch.autograd.grad(result.loss * 3, [*states, draft_lm_head])  # upstream scale reaches all
    expected_grads = torch.autograd.grad(total * 3, [*states, draft_lm_head])
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def test_greedy_acceptance_per_step_and_target_row():
    """accepted[k, b * (T - 2) + j]: step k's draft at row j - k names the target's argmax at j + 1."""
    states, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask = _ttt_inputs()
    result = eagle3_ttt_loss(
        states, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask, chunk_size=5
    )
    batch, seq, _ = target_final_hidden.shape
    for k, step_states in enumerate(states):
        for b in range(batch):
            for j in range(seq - 2):
                row = b * (seq - 2) + j
                scored = j >= k and bool(loss_mask[b, j + 2])
                assert bool(result.scored[k, row]) == scored
                if scored:
                    draft_token = draft_token_ids[(draft_lm_head @ step_states[b, j - k]).argmax()]
                    target_token = (target_lm_head @ target_final_hidden[b, j + 1]).argmax()
                    assert bool(result.accepted[k, row]) == bool(draft_token == target_token)
                else:
                    assert not result.accepted[k, row]
    torch.testing.assert_close(result.step_accuracy, result.accepted.sum(-1) / result.scored.sum(-1))


@pytest.mark.parametrize("precision", ["autocast", "bfloat16 head"])
def test_shared_target_path_follows_the_per_step_formula_in_bf16(precision):
    inputs = list(_ttt_inputs())
    if precision == "bfloat16 head":
        inputs[0] = [s.detach().bfloat16().requires_grad_() for s in inputs[0]]
        inputs[1] = inputs[1].detach().bfloat16().requires_grad_()
    states, draft_lm_head = inputs[0], inputs[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast"):
        result = eagle3_ttt_loss(*inputs, chunk_size=4)
        total, step_losses, *_ = _per_step_ttt_loss(*inputs, 4)
    torch.testing.assert_close(result.step_losses, step_losses, rtol=0.02, atol=0.02)
    grads = torch.autograd.grad(result.loss, [*states, draft_lm_head])
    expected_grads = torch.autograd.grad(total, [*states, draft_lm_head])
    for grad, expected_grad in zip(grads, expected_grads):
        assert grad.dtype == expected_grad.dtype
        torch.testing.assert_close(grad, expected_grad, rtol=0.05, atol=0.01)


class _MatmulFlops(TorchDispatchMode):
    """2·m·k·n per matrix product (mm, addmm, in place or out=); row-wise dots are not counted."""

    flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "addmm_"):
            left, right = args[:2] if name == "mm" else args[1:3]
            self.flops += 2 * left.shape[0] * left.shape[1] * right.shape[1]
        return func(*args, **(kwargs or {}))


def _matmul_flops(run) -> int:
    with _MatmulFlops() as counter:
        run()
    return counter.flops


def test_ttt_loss_projects_each_scored_target_position_once_for_all_steps():
    """Vocabulary work only for the positions a loss reads (the loss mask), once for all steps."""
    inputs = _ttt_inputs()
    states, _, draft_token_ids, target_final_hidden, target_lm_head, loss_mask = inputs
    hidden = target_final_hidden.shape[-1]
    rows, num_steps = int(loss_mask[:, 2:].sum()), len(states)
    assert 0 < rows < loss_mask[:, 2:].numel()  # some positions are not scored
    target_flops = 2 * rows * target_lm_head.shape[0] * hidden  # one full-vocab projection per position
    draft_flops = 2 * rows * len(draft_token_ids) * hidden  # per step and product
    with_grad = _matmul_flops(lambda: eagle3_ttt_loss(*inputs, chunk_size=5))
    with torch.no_grad():
        without_grad = _matmul_flops(lambda: eagle3_ttt_loss(*inputs, chunk_size=5))
    assert with_grad == target_flops + num_steps * 3 * draft_flops  # logits, d hidden, d weight
    assert without_grad == target_flops + num_steps * draft_flops


class _LiveLogits(TorchDispatchMode):
    """Peak number of elements held at once by new tensors of at least `threshold` elements."""

    def __init__(self, threshold: int):
        super().__init__()
        self.threshold, self.live, self.peak = threshold, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = [*args, *(kwargs or {}).values()]  # out= tensors are not new
        inputs = {a.untyped_storage().data_ptr() for a in given if isinstance(a, torch.Tensor)}
        outputs = out if isinstance(out, (tuple, list)) else [out]
        for tensor in outputs:
            new = isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs
            if new and tensor.numel() >= self.threshold:
                self.live.append((weakref.ref(tensor), tensor.numel()))
        self.live = [(ref, size) for ref, size in self.live if ref() is not None]
        self.peak = max(self.peak, sum(size for _, size in self.live))
        return out


@pytest.mark.parametrize("num_steps,batch", [(1, 2), (6, 2), (6, 8)])
def test_ttt_loss_memory_does_not_grow_with_steps_or_rows(num_steps, batch):
    vocab, draft_vocab, chunk = 1024, 512, 8  # a chunk of draft logits (4096) outsizes every input
    inputs = _ttt_inputs(batch, 12, 4, vocab, draft_vocab, num_steps)
    with _LiveLogits(threshold=chunk * draft_vocab) as live:
        result = eagle3_ttt_loss(*inputs, chunk_size=chunk)
    result.loss.backward()
    # At worst: the draft side's two reused blocks (logits, log-softmax) beside one target chunk's
    # full-vocab projection and its draft-vocab gather. Never K or N / chunk copies.
    assert live.peak <= 2 * chunk * draft_vocab + chunk * vocab + chunk * draft_vocab
    assert live.peak >= chunk * vocab  # the tracker saw the projection


def test_rows_no_step_scores_cannot_poison_the_ttt_loss():
    states, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask = _ttt_inputs()
    seq = loss_mask.shape[1]
    loss_mask[:, 5] = 0
    target_final_hidden[:, 4] = float("nan")  # its label (position 5) is masked for every step
    poisoned = [s.detach().clone() for s in states]
    for k, s in enumerate(poisoned):
        s[:, seq - k - 2 :] = float("nan")  # step k scores rows t < T - k - 2 only
        s[:, 5 - k - 2] = float("nan")  # row t of step k predicts position t + k + 2 = 5, masked
        s.requires_grad_()
    result = eagle3_ttt_loss(
        poisoned, draft_lm_head, draft_token_ids, target_final_hidden, target_lm_head, loss_mask, 4
    )
    grads = torch.autograd.grad(result.loss, [*poisoned, draft_lm_head])
    assert torch.isfinite(result.loss) and all(torch.isfinite(g).all() for g in grads)
    assert torch.isfinite(result.outside_mass) and torch.isfinite(result.step_accuracy).all()


def test_medusa_loss_weights_heads_and_shifts_labels():
    target_final_hidden, target_lm_head, loss_mask = _token_batch()
    batch, seq, hidden = target_final_hidden.shape
    states = [torch.randn(batch, seq, hidden) for _ in range(2)]
    lm_heads = [torch.randn(20, hidden, requires_grad=True) for _ in range(2)]
    result = medusa_loss(states, lm_heads, target_final_hidden, target_lm_head, loss_mask, chunk_size=4)
    expected = []
    for i in range(2):
        length = seq - i - 2
        mask = loss_mask[:, i + 2 :].reshape(-1).float()
        expected.append(
            _reference_kl(
                states[i][:, :length].reshape(-1, hidden),
                lm_heads[i],
                target_final_hidden[:, i + 1 : i + 1 + length].reshape(-1, hidden),
                target_lm_head,
                mask,
            )
        )
    torch.testing.assert_close(result.head_losses, torch.stack(expected))
    torch.testing.assert_close(result.loss, expected[0] + 0.8 * expected[1])


def test_eagle1_loss_is_smooth_l1_on_the_next_feature_plus_a_tenth_of_the_kl():
    target_final_hidden, target_lm_head, loss_mask = _token_batch()
    batch, seq, hidden = target_final_hidden.shape
    predicted = torch.randn(batch, seq, hidden, requires_grad=True)
    result = eagle1_loss(predicted, target_lm_head, target_final_hidden, loss_mask, chunk_size=6)
    rows_predicted = predicted[:, : seq - 2].reshape(-1, hidden)
    rows_target = target_final_hidden[:, 1 : seq - 1].reshape(-1, hidden)
    mask = loss_mask[:, 2:].reshape(-1).float()
    feature = (
        F.smooth_l1_loss(rows_predicted, rows_target, reduction="none").mean(-1) * mask
    ).sum() / mask.sum()
    kl = _reference_kl(rows_predicted, target_lm_head, rows_target, target_lm_head, mask)
    torch.testing.assert_close(result.loss, feature + 0.1 * kl)
    (grad,) = torch.autograd.grad(result.loss, predicted)
    (expected_grad,) = torch.autograd.grad(feature + 0.1 * kl, predicted)
    torch.testing.assert_close(grad, expected_grad)


def test_too_short_sequences_for_the_steps_are_an_error():
    target_final_hidden, target_lm_head, loss_mask = _token_batch(seq=4)
    steps = [torch.randn(2, 4, 8) for _ in range(3)]
    with pytest.raises(ValueError, match="TTT step 2 needs sequences longer than 4 tokens, got 4"):
        eagle3_ttt_loss(
            steps, torch.randn(20, 8), torch.arange(20), target_final_hidden, target_lm_head, loss_mask, 4
        )
