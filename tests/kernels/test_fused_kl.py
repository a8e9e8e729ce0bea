"""The fused KL kernel (under the Triton interpreter) and its torch reference against the
training loss `train.losses.chunked_soft_kl` and against plain autograd."""

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.triton_required import import_triton

import_triton()

from kernels.fused_kl import KLBlocks, fused_soft_kl  # noqa: E402
from kernels.soft_kl_reference import soft_kl_reference  # noqa: E402
from tests.kernels.allocations import TrackAllocations  # noqa: E402
from train.losses import chunked_soft_kl  # noqa: E402

# Small tiles so that every shape below spans several row blocks, vocab tiles and hidden steps,
# with partial ones at the edges, and two forward vocab slices to merge; the backward blocks
# (16 rows x 192 columns) split both ways too.
BLOCKS = KLBlocks(rows=16, vocab=128, hidden=32, vocab_splits=2)
CHUNK_ROWS = 16
VOCAB_CHUNK = 192
STEP_WEIGHT = 0.8**2  # a TTT step weight folded into the row weights, as the trainer does


def _inputs(rows, hidden, vocab, target_hidden_size=None, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    target_hidden_size = target_hidden_size or hidden

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    draft_hidden = randn(rows, hidden).requires_grad_()
    draft_weight = randn(vocab, hidden).requires_grad_()
    target_hidden = randn(rows, target_hidden_size)
    target_weight = randn(vocab, target_hidden_size)
    mask = torch.rand(rows, generator=generator) > 0.3
    mask[0] = True  # at least one counted row
    return draft_hidden, draft_weight, target_hidden, target_weight, mask


def _naive_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, row_weights):
    """Whole [N, Vd] logits, gradient by autograd: independent of both hand-written backwards."""
    target_logprobs = F.log_softmax((target_hidden @ target_weight.T).float(), dim=-1)
    draft_logprobs = F.log_softmax((draft_hidden @ draft_weight.T).float(), dim=-1)
    kl_rows = (target_logprobs.exp() * (target_logprobs - draft_logprobs)).sum(-1)
    return (kl_rows * row_weights).sum()


def _run(soft_kl, inputs, row_weights, upstream=3.0, **kw):
    draft_hidden, draft_weight, target_hidden, target_weight, _ = inputs
    out = soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, row_weights, CHUNK_ROWS, **kw)
    grads = torch.autograd.grad(out.loss * upstream, (draft_hidden, draft_weight))
    return out, grads


def _fused(inputs, row_weights, upstream=3.0, blocks=BLOCKS):
    """The kernel path with every uninitialised allocation poisoned (NaN / -1)."""
    with TrackAllocations(poison=True) as track:
        result = _run(fused_soft_kl, inputs, row_weights, upstream, blocks=blocks, vocab_chunk=VOCAB_CHUNK)
    assert track.poisoned >= 3  # the forward's partials and argmaxes, the backward's dlogits block
    return result


@pytest.mark.parametrize("rows,hidden,vocab", [(13, 8, 11), (33, 40, 300)])
def test_reference_matches_the_training_loss_and_autograd(rows, hidden, vocab):
    inputs = _inputs(rows, hidden, vocab)
    draft_hidden, draft_weight, target_hidden, target_weight, mask = inputs
    row_weights = mask.float() / mask.sum()
    training = chunked_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask, CHUNK_ROWS)
    training_grads = torch.autograd.grad(training.loss * 3, (draft_hidden, draft_weight))
    reference, reference_grads = _run(soft_kl_reference, inputs, row_weights)

    torch.testing.assert_close(reference.loss, training.loss)
    assert torch.equal(reference.draft_argmax, training.draft_argmax)
    assert torch.equal(reference.target_argmax, training.target_argmax)
    for grad, expected in zip(reference_grads, training_grads):
        torch.testing.assert_close(grad, expected)

    uneven_weights = torch.rand(rows, generator=torch.Generator().manual_seed(1)) * mask  # not a mean
    reference, reference_grads = _run(soft_kl_reference, inputs, uneven_weights)
    naive = _naive_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, uneven_weights)
    torch.testing.assert_close(reference.loss, naive)
    for grad, expected in zip(reference_grads, torch.autograd.grad(naive * 3, (draft_hidden, draft_weight))):
        torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("vocab", [50, 129, 300])
@pytest.mark.parametrize("hidden", [16, 40])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_kernel_matches_the_training_loss_in_value_gradient_and_argmax(rows, hidden, vocab):
    inputs = _inputs(rows, hidden, vocab, seed=rows * 1000 + hidden * 10 + vocab)
    draft_hidden, draft_weight, target_hidden, target_weight, mask = inputs
    training = chunked_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask, CHUNK_ROWS)
    training_grads = torch.autograd.grad(training.loss * STEP_WEIGHT * 3, (draft_hidden, draft_weight))

    row_weights = mask.float() / mask.sum() * STEP_WEIGHT
    fused, fused_grads = _fused(inputs, row_weights)

    torch.testing.assert_close(fused.loss, training.loss * STEP_WEIGHT)
    assert torch.equal(fused.draft_argmax, training.draft_argmax)
    assert torch.equal(fused.target_argmax, training.target_argmax)
    for grad, expected in zip(fused_grads, training_grads):
        torch.testing.assert_close(grad, expected)


def test_kernel_with_a_wider_target_and_uneven_weights_matches_the_reference():
    inputs = _inputs(rows=21, hidden=24, vocab=200, target_hidden_size=56, seed=5)
    row_weights = torch.rand(21, generator=torch.Generator().manual_seed(2)) * inputs[-1]
    reference, reference_grads = _run(soft_kl_reference, inputs, row_weights, upstream=-0.5)
    # Seven vocab tiles in three slices (3, 3, 1); a negative upstream gradient reaches both grads.
    fused, fused_grads = _fused(
        inputs, row_weights, -0.5, KLBlocks(rows=16, vocab=32, hidden=16, vocab_splits=3)
    )
    torch.testing.assert_close(fused.loss, reference.loss)
    for grad, expected in zip(fused_grads, reference_grads):
        torch.testing.assert_close(grad, expected)


def test_argmax_ties_keep_the_first_index_across_tiles_and_slices():
    """Small integers make every logit exact, so the three top rows tie in any summation order."""
    generator = torch.Generator().manual_seed(6)
    rows, hidden, vocab = 3, 16, 300

    def integer_weights():
        weight = torch.randint(-2, 3, (vocab, hidden), generator=generator).float()
        weight[[5, 140, 290]] = 3.0  # tiles 0, 1 and 2 of 128 columns; vocab slices 0 and 1
        return weight

    draft_hidden = torch.ones(rows, hidden, requires_grad=True)
    row_weights = torch.ones(rows)
    args = (draft_hidden, integer_weights(), torch.ones(rows, hidden), integer_weights(), row_weights, 4)
    fused = fused_soft_kl(*args, blocks=BLOCKS)
    reference = soft_kl_reference(*args)
    assert fused.draft_argmax.tolist() == fused.target_argmax.tolist() == [5, 5, 5]
    assert torch.equal(reference.draft_argmax, fused.draft_argmax)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN row
def test_masked_rows_holding_nan_add_nothing():
    inputs = _inputs(rows=9, hidden=16, vocab=70, seed=3)
    draft_hidden, draft_weight, target_hidden, target_weight, mask = inputs
    with torch.no_grad():
        draft_hidden[4] = float("nan")  # e.g. a padding row
        target_hidden[4] = float("nan")
    mask[4] = False
    row_weights = mask.float() / mask.sum()
    reference, reference_grads = _run(soft_kl_reference, inputs, row_weights)
    fused, fused_grads = _fused(inputs, row_weights)
    assert torch.isfinite(fused.loss)
    torch.testing.assert_close(fused.loss, reference.loss)
    for grad, expected in zip(fused_grads, reference_grads):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, expected)


def test_gradients_only_where_asked_and_none_without_grad_mode():
    draft_hidden, draft_weight, target_hidden, target_weight, mask = _inputs(rows=7, hidden=16, vocab=50)
    draft_weight.requires_grad_(False)
    row_weights = mask.float()
    fused = fused_soft_kl(
        draft_hidden, draft_weight, target_hidden, target_weight, row_weights, 4, blocks=BLOCKS
    )
    fused.loss.backward()
    reference = soft_kl_reference(draft_hidden, draft_weight, target_hidden, target_weight, row_weights, 4)
    (expected,) = torch.autograd.grad(reference.loss, (draft_hidden,))
    torch.testing.assert_close(draft_hidden.grad, expected)
    assert draft_weight.grad is None

    with torch.no_grad():
        fused = fused_soft_kl(
            draft_hidden, draft_weight, target_hidden, target_weight, row_weights, 4, blocks=BLOCKS
        )
    assert not fused.loss.requires_grad
    torch.testing.assert_close(fused.loss, reference.loss.detach())


def test_bf16_inputs_are_computed_in_fp32_inside_the_kernel():
    inputs = _inputs(rows=7, hidden=16, vocab=129, seed=4, dtype=torch.bfloat16)
    draft_hidden, draft_weight, target_hidden, target_weight, mask = inputs
    row_weights = mask.float() / mask.sum()
    fused, fused_grads = _fused(inputs, row_weights, upstream=1.0)
    exact = _naive_soft_kl(
        draft_hidden.float(), draft_weight.float(), target_hidden.float(), target_weight.float(), row_weights
    )
    torch.testing.assert_close(fused.loss, exact, rtol=1e-4, atol=1e-4)  # fp32 math on bf16 values
    exact_grads = torch.autograd.grad(exact, (draft_hidden, draft_weight))
    for grad, expected in zip(fused_grads, exact_grads):
        assert grad.dtype == torch.bfloat16
        torch.testing.assert_close(grad.float(), expected.float(), rtol=2e-2, atol=2e-3)


def test_no_allocation_scales_with_rows_times_vocab():
    rows, hidden, vocab = 64, 16, 300  # rows x vocab (19,200) outsizes every input and gradient (4,800)
    inputs = _inputs(rows, hidden, vocab)
    row_weights = inputs[-1].float()
    with TrackAllocations(poison=False) as forward:
        out = fused_soft_kl(*inputs[:4], row_weights, CHUNK_ROWS, blocks=BLOCKS, vocab_chunk=VOCAB_CHUNK)
    with TrackAllocations(poison=False) as backward:
        out.loss.backward()
    assert max(forward.largest, backward.largest) <= max(vocab * hidden, CHUNK_ROWS * VOCAB_CHUNK)

    # The tracker sees a logits-sized tensor where one exists, in the forward and in the backward.
    inputs[0].grad = inputs[1].grad = None
    with TrackAllocations(poison=False) as naive_forward:
        loss = _naive_soft_kl(*inputs[:4], row_weights)
    with TrackAllocations(poison=False) as naive_backward:
        loss.backward()
    assert naive_forward.largest >= rows * vocab and naive_backward.largest >= rows * vocab


def test_bad_shapes_raise_a_clear_error():
    draft_hidden, draft_weight, target_hidden, target_weight, mask = _inputs(rows=5, hidden=8, vocab=20)
    with pytest.raises(ValueError, match="same vocab"):
        fused_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight[:-1], mask.float(), 4)
    with pytest.raises(ValueError, match="row_weights"):
        fused_soft_kl(draft_hidden, draft_weight, target_hidden, target_weight, mask[:-1].float(), 4)
    with pytest.raises(ValueError, match="KLBlocks.vocab=100"):
        KLBlocks(vocab=100)
    with pytest.raises(ValueError, match="chunk_size"):
        soft_kl_reference(draft_hidden, draft_weight, target_hidden, target_weight, mask.float(), 0)
