"""Distillation losses of the draft heads, computed in chunks of rows so that no more than one
chunk x vocab block of logits exists at a time, forward or backward. The EAGLE-3 loss chunks over
target positions and scores each chunk against all TTT steps, so the target is projected once.

Row alignment (token-aligned inputs, docs/ARCHITECTURE.md): a draft state at row t of step
(or Medusa head) k predicts the token at t + k + 2. Its soft label is the target's
distribution at position t + k + 1 (which predicts that same token), and it counts where
loss_mask[t + k + 2] is set. Rows whose label lies past the sequence end are not used.

KL is forward KL(target || draft). Soft cross-entropy differs from it by the target's entropy,
a constant, so the gradients are the same; we report KL because it is 0 at a perfect draft.
Metrics are returned as tensors (no host sync); read them at the log interval.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.registry import kernel

STEP_DECAY = 0.8  # weight 0.8^k of TTT step k / Medusa head k (EAGLE, Medusa papers)
EAGLE1_CE_WEIGHT = 0.1  # EAGLE-1: SmoothL1(feature) + 0.1 x soft CE


@dataclass
class SoftKL:
    loss: torch.Tensor  # scalar: mean KL over the masked rows (0 when none)
    draft_argmax: torch.Tensor  # int64 [N], index into the draft weight's rows
    target_argmax: torch.Tensor  # int64 [N], index into the target weight's rows
    tokens: torch.Tensor  # int64 scalar: masked rows


def chunked_soft_kl(
    draft_hidden: torch.Tensor,
    draft_weight: torch.Tensor,
    target_hidden: torch.Tensor,
    target_weight: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk_size: int,
) -> SoftKL:
    """Mean over masked rows of KL(target || draft), both softmaxed over the same vocab.

    draft_hidden [N, H] @ draft_weight [V, H]ᵀ gives the draft logits; target_hidden [N, Ht] @
    target_weight [V, Ht]ᵀ the target's (pass the target lm_head's draft-vocab rows for a reduced
    vocab: the target distribution is then renormalised over it). loss_mask [N].
    Gradients flow to draft_hidden and draft_weight; the target side is constant.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    if draft_weight.shape[0] != target_weight.shape[0]:
        raise ValueError(
            f"draft weight has {draft_weight.shape[0]} rows, target weight {target_weight.shape[0]}: "
            "both must cover the same vocab"
        )
    mask = loss_mask.bool()
    tokens = mask.sum()
    row_weights = mask.float() / tokens.clamp(min=1)
    # The fused Triton kernel on CUDA, its torch reference (chunked, same maths) elsewhere.
    soft_kl = kernel("soft_kl", draft_hidden.device)
    loss, draft_argmax, target_argmax = soft_kl(
        draft_hidden, draft_weight, target_hidden.detach(), target_weight.detach(), row_weights, chunk_size
    )
    return SoftKL(loss=loss, draft_argmax=draft_argmax, target_argmax=target_argmax, tokens=tokens)


def _rows(tensor: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """tensor [B, T, ...] -> its positions start .. start + length - 1 as rows [B * length, ...]."""
    return tensor[:, start : start + length].reshape(-1, *tensor.shape[2:])


def _check_shift(step: int, seq_len: int, what: str) -> int:
    length = seq_len - step - 2
    if length < 1:
        raise ValueError(f"{what} {step} needs sequences longer than {step + 2} tokens, got {seq_len}")
    return length


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, values, 0).sum() / mask.sum().clamp(min=1)


@dataclass
class TargetRows:
    """The target side of a chunk of positions: what every TTT step scored against them needs."""

    logprobs: torch.Tensor  # float32 [n, Vd]: log-softmax renormalised over the draft vocab
    argmax: torch.Tensor  # int64 [n]: argmax over the FULL vocab, as a target id
    outside_mass: torch.Tensor  # float32 [n]: target probability outside the draft vocab


@torch.no_grad()
def project_target(
    target_hidden: torch.Tensor, target_lm_head: torch.Tensor, draft_token_ids: torch.Tensor
) -> TargetRows:
    """target_hidden [n, Ht], target_lm_head [V, Ht], draft_token_ids int64 [Vd] -> TargetRows.

    One full-vocab projection gives all three facts: the draft-vocab logits are a column gather
    of it, which costs far less than projecting onto the draft vocab a second time.
    """
    target_logits = (target_hidden @ target_lm_head.T).float()  # [n, V]
    argmax = target_logits.argmax(-1)
    log_total = torch.logsumexp(target_logits, dim=-1)  # [n]
    draft_vocab_logits = target_logits.index_select(1, draft_token_ids)  # [n, Vd]
    del target_logits  # one full-vocab chunk at a time
    log_inside = torch.logsumexp(draft_vocab_logits, dim=-1)  # [n]
    return TargetRows(
        logprobs=draft_vocab_logits.sub_(log_inside[:, None]),
        argmax=argmax,
        outside_mass=-torch.expm1(log_inside - log_total),
    )


def _row_dot(left: torch.Tensor, right: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """[n, V] x [n, V] -> [n]: row-wise dot products, the products written into scratch [n, V].

    A reused scratch block spares a fresh allocation (see _mm_into); multiply-then-sum keeps
    torch's pairwise summation, where einsum's batched matmul drifts ~1e-5 relative in fp32.
    """
    return torch.mul(left, right, out=scratch).sum(-1)


def _mm_into(out: torch.Tensor, left: torch.Tensor, right: torch.Tensor, accumulate: bool = False):
    """out = left @ right (or out += left @ right), reusing `out`.

    On CPU every fresh [rows, vocab] result is a fresh mmap whose page faults cost ~20% of the
    TTT loss; one reused buffer avoids them. Under autocast (or inputs not in out's dtype) the
    product runs in the dtype autocast picks, as everywhere else in the step, and is copied in.
    """
    if torch.is_autocast_enabled(left.device.type) or not left.dtype == right.dtype == out.dtype:
        product = left @ right
        return out.add_(product) if accumulate else out.copy_(product)
    return out.addmm_(left, right) if accumulate else torch.mm(left, right, out=out)


class _TTTSoftKL(torch.autograd.Function):
    """Σ_k step_weights[k] Σ_r row_weights[k, r] · KL(target_r || draft_{k,r}) over the draft vocab.

    Target row r is scored by every TTT step (draft row draft_rows[k, r] of step k), so the loop
    runs over chunks of target rows: each chunk is projected once and reused by all K steps,
    and no more than one chunk x vocab block of logits per side exists at a time. Gradients are
    built during the forward, as in kernels/soft_kl_reference.py.
    """

    @staticmethod
    def forward(
        ctx,
        draft_states,  # [K * B * T, H], the K steps' states stacked
        draft_weight,  # [Vd, H]
        target_hidden,  # [N, Ht]
        target_lm_head,  # [V, Ht]
        draft_token_ids,  # int64 [Vd]
        draft_rows,  # int64 [K, N]: the draft_states row step k pairs with target row r
        row_weights,  # float32 [K, N]: 0 where step k does not score target row r
        step_weights,  # float32 [K]
        chunk_size,
        with_grad,
    ):
        need_states_grad = with_grad and ctx.needs_input_grad[0]
        need_weight_grad = with_grad and ctx.needs_input_grad[1]
        num_steps, num_rows = draft_rows.shape
        device = draft_states.device
        step_losses = torch.zeros(num_steps, dtype=torch.float32, device=device)
        draft_argmax = torch.empty(num_steps, num_rows, dtype=torch.int64, device=device)
        target_argmax = torch.empty(num_rows, dtype=torch.int64, device=device)
        outside_mass = torch.empty(num_rows, dtype=torch.float32, device=device)
        grad_states = torch.zeros_like(draft_states) if need_states_grad else None
        grad_weight = (
            torch.zeros(draft_weight.shape, dtype=torch.float32, device=device) if need_weight_grad else None
        )
        # The draft side's two [chunk, Vd] blocks, reused by every step and chunk: the logits
        # (then scratch for row products) and their log-softmax.
        draft_logits_block = torch.empty(min(chunk_size, num_rows), draft_weight.shape[0], device=device)
        draft_logprobs_block = torch.empty_like(draft_logits_block)
        for start in range(0, num_rows, chunk_size):
            rows = slice(start, start + chunk_size)
            target = project_target(target_hidden[rows], target_lm_head, draft_token_ids)
            target_argmax[rows], outside_mass[rows] = target.argmax, target.outside_mass
            # KL = Σ target_probs · target_logprobs - Σ target_probs · draft_logprobs; the first term
            # is the same for every step, so only target_probs stays alive across the steps.
            target_probs = target.logprobs.exp()  # [n, Vd]
            scratch = draft_logits_block[: len(target_probs)]
            target_neg_entropy = _row_dot(target_probs, target.logprobs, scratch)  # [n]
            del target
            for step in range(num_steps):
                index = draft_rows[step, rows]  # [n]
                weights = row_weights[step, rows]  # [n]
                used = (weights > 0)[:, None]
                hidden = torch.where(used, draft_states.index_select(0, index), 0)  # [n, H]; 0 x NaN is NaN
                draft_logits = _mm_into(scratch, hidden, draft_weight.T)  # [n, Vd]
                draft_argmax[step, rows] = draft_logits.argmax(-1)
                draft_logprobs = torch.log_softmax(
                    draft_logits, dim=-1, out=draft_logprobs_block[: len(index)]
                )
                kl_rows = target_neg_entropy - _row_dot(target_probs, draft_logprobs, scratch)  # [n]
                step_losses[step] += (kl_rows * weights).sum()
                if need_states_grad or need_weight_grad:
                    # d loss / d draft_logits of a weighted KL row: weight x (draft_probs - target_probs).
                    grad_logits = draft_logprobs.exp_().sub_(target_probs)
                    grad_logits = grad_logits.mul_((weights * step_weights[step])[:, None])
                    if need_states_grad:
                        grad_rows = grad_logits.to(draft_weight.dtype) @ draft_weight  # [n, H]
                        # A step's draft rows are distinct (_ttt_pairing): a copy, not an add
                        # (index_add_ is ~10x slower on CPU).
                        grad_states.index_copy_(0, index, grad_rows.to(grad_states.dtype))
                    if need_weight_grad:
                        _mm_into(grad_weight, grad_logits.T.to(hidden.dtype), hidden, accumulate=True)
            del target_probs  # before the next chunk's projection
        ctx.save_for_backward(grad_states, grad_weight)
        ctx.weight_dtype = draft_weight.dtype
        loss = (step_weights * step_losses).sum()
        ctx.mark_non_differentiable(step_losses, draft_argmax, target_argmax, outside_mass)
        return loss, step_losses, draft_argmax, target_argmax, outside_mass

    @staticmethod
    def backward(ctx, grad_loss, *_grad_metrics):
        grad_states, grad_weight = ctx.saved_tensors
        states_grad = grad_states * grad_loss if grad_states is not None else None
        weight_grad = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return states_grad, weight_grad, *[None] * 8


def _ttt_pairing(loss_mask: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which draft row each step scores against each target row, and whether it counts.

    Target row (b, j) is position j + 1 (j < T - 2). Step k scores it with its draft row t = j - k
    (which predicts the token at j + 2), masked by loss_mask[b, j + 2]: the same mask for every
    step, less the rows j < k that have no draft partner. Those point at row (j - k) mod T, one
    step k never pairs, so each step's draft rows are distinct.
    Returns draft_rows int64 [K, B * (T - 2)] into the stacked states [K * B * T] and step_masks
    bool [K, B * (T - 2)].
    """
    batch, seq_len = loss_mask.shape
    device = loss_mask.device
    step = torch.arange(num_steps, device=device)[:, None, None]  # [K, 1, 1]
    sample = torch.arange(batch, device=device)[None, :, None]  # [1, B, 1]
    row = torch.arange(seq_len - 2, device=device)[None, None, :]  # [1, 1, T - 2]
    draft_rows = (step * batch + sample) * seq_len + (row - step) % seq_len  # [K, B, T - 2]
    step_masks = loss_mask.bool()[None, :, 2:] & (row >= step)  # [K, B, T - 2]
    return draft_rows.reshape(num_steps, -1), step_masks.reshape(num_steps, -1)


@dataclass
class TTTLoss:
    loss: torch.Tensor  # scalar Σ_k decay^k step_losses[k]; the only tensor that carries gradients
    step_losses: torch.Tensor  # [K] mean KL per step over the draft vocab
    step_accuracy: torch.Tensor  # [K] draft argmax == target argmax (full target vocab)
    step_tokens: torch.Tensor  # [K] masked rows per step
    outside_mass: torch.Tensor  # scalar: mean target probability outside the draft vocab (step-0 rows)
    argmax_coverage: torch.Tensor  # scalar: fraction of step-0 rows whose target argmax is in the draft vocab
    # Per (step k, target row r = (b, j), position j + 1), r < B * (T - 2), as _ttt_pairing lays them out:
    scored: torch.Tensor  # bool [K, N]: step k scores row r (loss mask, and a draft row to pair with)
    accepted: (
        torch.Tensor
    )  # bool [K, N]: step k's draft argmax == the full-vocab target argmax (greedy acceptance)


def eagle3_ttt_loss(
    step_states: Sequence[torch.Tensor],
    draft_lm_head: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_final_hidden: torch.Tensor,
    target_lm_head: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk_size: int,
    step_decay: float = STEP_DECAY,
) -> TTTLoss:
    """EAGLE-3 training-time-test loss: Σ_k decay^k KL_k over the draft vocab.

    step_states: K x [B, T, H], the head's normed states (`UnrolledSteps.normed_states`);
    draft_lm_head [Vd, H]; draft_token_ids int64 [Vd] (target id per draft id);
    target_final_hidden [B, T, Ht]; target_lm_head [V, Ht]; loss_mask [B, T].
    The target distribution is renormalised over the draft vocab; the mass it had outside is
    reported, not hidden. Each target position is projected once (full vocab) for all K steps.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    num_steps = len(step_states)
    batch, seq_len = loss_mask.shape
    _check_shift(num_steps - 1, seq_len, "TTT step")
    for step, states in enumerate(step_states):
        if states.shape[:2] != (batch, seq_len):
            raise ValueError(
                f"TTT step {step}: states of shape {tuple(states.shape)} do not match loss_mask [{batch}, {seq_len}]"
            )
    draft_rows, step_masks = _ttt_pairing(loss_mask, num_steps)
    step_tokens = step_masks.sum(-1)  # [K]
    row_weights = step_masks.float() / step_tokens.clamp(min=1)[:, None]  # [K, N]
    step_weights = step_decay ** torch.arange(num_steps, dtype=torch.float32, device=loss_mask.device)
    # No step scores a target row outside step 0's mask, so only those rows are projected and
    # scored: prompt tokens (a third or more of a chat row) cost no vocabulary work. One host
    # read per step (the count), against seconds of matmuls saved.
    scored_rows = step_masks[0].nonzero().squeeze(1)  # [n]
    target_hidden = _rows(target_final_hidden.detach(), 1, seq_len - 2).index_select(
        0, scored_rows
    )  # [n, Ht]
    states = torch.stack(list(step_states)).reshape(-1, step_states[0].shape[-1])  # [K * B * T, H]
    # Grad mode is off inside an autograd.Function's forward, so ask here whether to build gradients.
    with_grad = torch.is_grad_enabled() and (states.requires_grad or draft_lm_head.requires_grad)
    loss, step_losses, scored_draft_argmax, scored_target_argmax, scored_outside_mass = _TTTSoftKL.apply(
        states,
        draft_lm_head,
        target_hidden,
        target_lm_head.detach(),
        draft_token_ids,
        draft_rows.index_select(1, scored_rows),
        row_weights.index_select(1, scored_rows),
        step_weights,
        chunk_size,
        with_grad,
    )
    # Back to the [K, N] layout of every target row (rows not scored: masked out below).
    draft_argmax = scored_draft_argmax.new_zeros(step_masks.shape).index_copy_(
        1, scored_rows, scored_draft_argmax
    )
    target_argmax = scored_target_argmax.new_full(step_masks.shape[1:], -1).index_copy_(
        0, scored_rows, scored_target_argmax
    )
    outside_mass = scored_outside_mass.new_zeros(step_masks.shape[1:]).index_copy_(
        0, scored_rows, scored_outside_mass
    )
    correct = draft_token_ids[draft_argmax] == target_argmax  # [K, N]
    t2d = torch.zeros(target_lm_head.shape[0], dtype=torch.bool, device=draft_token_ids.device)
    t2d[draft_token_ids] = True
    return TTTLoss(
        loss=loss,
        step_losses=step_losses,
        step_accuracy=(correct & step_masks).sum(-1) / step_tokens.clamp(min=1),
        step_tokens=step_tokens,
        outside_mass=_masked_mean(outside_mass, step_masks[0]),
        argmax_coverage=_masked_mean(t2d[target_argmax].float(), step_masks[0]),
        scored=step_masks,
        accepted=correct & step_masks,
    )


@dataclass
class Eagle1Loss:
    loss: torch.Tensor  # scalar: feature_loss + ce_weight * kl
    feature_loss: torch.Tensor  # scalar SmoothL1 to the next target feature
    kl: torch.Tensor  # scalar KL(target || draft) over the full vocab
    accuracy: torch.Tensor  # scalar draft argmax == target argmax
    tokens: torch.Tensor  # masked rows


def eagle1_loss(
    predicted_features: torch.Tensor,
    lm_head: torch.Tensor,
    target_final_hidden: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk_size: int,
    ce_weight: float = EAGLE1_CE_WEIGHT,
) -> Eagle1Loss:
    """EAGLE-1: SmoothL1(predicted feature, next target feature) + ce_weight x soft CE.

    predicted_features [B, T, H] (row t estimates final_hidden at t + 1); lm_head [V, H], the
    target's (frozen); target_final_hidden [B, T, H]; loss_mask [B, T].
    """
    seq_len = loss_mask.shape[1]
    length = _check_shift(0, seq_len, "EAGLE-1 step")
    mask = _rows(loss_mask.bool(), 2, length)
    predicted = _rows(predicted_features, 0, length)
    target = _rows(target_final_hidden, 1, length).detach().to(predicted.dtype)
    feature_loss = _masked_mean(F.smooth_l1_loss(predicted, target, reduction="none").mean(-1), mask)
    kl = chunked_soft_kl(predicted, lm_head, target, lm_head, mask, chunk_size)
    accuracy = _masked_mean((kl.draft_argmax == kl.target_argmax).float(), mask)
    return Eagle1Loss(
        loss=feature_loss + ce_weight * kl.loss,
        feature_loss=feature_loss,
        kl=kl.loss,
        accuracy=accuracy,
        tokens=kl.tokens,
    )


@dataclass
class MedusaLoss:
    loss: torch.Tensor  # scalar Σ_i decay^i head_losses[i]
    head_losses: torch.Tensor  # [k] mean KL per head
    head_accuracy: torch.Tensor  # [k]
    head_tokens: torch.Tensor  # [k]


def medusa_loss(
    head_states: Sequence[torch.Tensor],
    head_lm_heads: Sequence[torch.Tensor],
    target_final_hidden: torch.Tensor,
    target_lm_head: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk_size: int,
    head_decay: float = STEP_DECAY,
) -> MedusaLoss:
    """Medusa with self-distilled labels: head i's soft label at row t is the target's
    distribution at t + i + 1 (over the token at t + i + 2). head_states: k x [B, T, H];
    head_lm_heads: k x [V, H]; target_final_hidden [B, T, H]; target_lm_head [V, H]."""
    seq_len = loss_mask.shape[1]
    _check_shift(len(head_states) - 1, seq_len, "Medusa head")
    mask = loss_mask.bool()
    losses, accuracies, tokens = [], [], []
    for head, (states, lm_head) in enumerate(zip(head_states, head_lm_heads)):
        length = seq_len - head - 2
        head_mask = _rows(mask, head + 2, length)
        kl = chunked_soft_kl(
            _rows(states, 0, length),
            lm_head,
            _rows(target_final_hidden, head + 1, length),
            target_lm_head,
            head_mask,
            chunk_size,
        )
        losses.append(kl.loss)
        accuracies.append(_masked_mean((kl.draft_argmax == kl.target_argmax).float(), head_mask))
        tokens.append(kl.tokens)
    head_losses = torch.stack(losses)
    weights = head_decay ** torch.arange(len(losses), device=head_losses.device, dtype=head_losses.dtype)
    return MedusaLoss(
        loss=(weights * head_losses).sum(),
        head_losses=head_losses,
        head_accuracy=torch.stack(accuracies),
        head_tokens=torch.stack(tokens),
    )


DFLASH_DECAY_GAMMA = 4.0  # slot j weighs exp(-(j - 1) / γ) (DFlash Eq. 4; ModelOpt suggests 4 for block 8)


@dataclass
class BlockLoss:
    loss: torch.Tensor  # scalar Σ_j weight_j · slot_losses[j]; the only tensor that carries gradients
    slot_losses: torch.Tensor  # [S - 1] mean KL over the draft vocab, slots 1 .. S - 1
    slot_accuracy: torch.Tensor  # [S - 1] draft argmax == full-vocab target argmax
    slot_tokens: torch.Tensor  # [S - 1] scored anchors per slot
    acceptance_length: torch.Tensor  # scalar: mean 1 + accepted slots of a block (greedy, exact for a block)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None):
    """Up to num_anchors anchor positions per row, uniformly among the positions a whose next token
    is trained (loss_mask[a + 1]): int64 [B, A] and whether each is real, bool [B, A] (rows with
    fewer candidates repeat a candidate, marked False)."""
    batch, seq = loss_mask.shape
    candidates = torch.zeros_like(loss_mask, dtype=torch.bool)
    candidates[:, :-1] = loss_mask[:, 1:].bool()
    count = min(num_anchors, seq)
    scores = torch.rand(batch, seq, generator=generator, device=loss_mask.device)
    scores = torch.where(candidates, scores, -1.0)
    picked, anchors = scores.topk(count, dim=1)
    return anchors, picked >= 0


def dflash_block_loss(
    slot_states: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    draft_lm_head: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_final_hidden: torch.Tensor,
    target_lm_head: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk_size: int,
    gamma: float = DFLASH_DECAY_GAMMA,
) -> BlockLoss:
    """Block drafter loss: Σ_j exp(-(j - 1)/γ) KL_j over the draft vocab, j = 1 .. S - 1.

    slot_states [B, A, S, H] (the head's normed states); anchors int64 [B, A]; anchor_valid bool
    [B, A]. Slot j of the block at anchor a scores the token at a + j: its soft label is the
    target's distribution at a + j - 1, and it counts where loss_mask[a + j] is set. Each slot is
    scored by the same chunked KL as EAGLE-3's steps (full-vocab target argmax, outside mass).
    """
    batch, num_anchors, size, _ = slot_states.shape
    seq = loss_mask.shape[1]
    target_hidden = target_final_hidden.detach()
    with_grad = torch.is_grad_enabled() and (slot_states.requires_grad or draft_lm_head.requires_grad)
    losses, slot_losses, accuracy, tokens, correct = [], [], [], [], []
    for slot in range(1, size):
        position = anchors + slot  # [B, A]
        in_range = position < seq
        position = position.clamp(max=seq - 1)
        scored = anchor_valid & in_range & loss_mask.bool().gather(1, position)
        rows = scored.flatten().nonzero().squeeze(1)  # [n]
        label_rows = target_hidden.gather(
            1, (position - 1)[..., None].expand(-1, -1, target_hidden.shape[-1])
        ).flatten(0, 1)
        states = slot_states[:, :, slot].flatten(0, 1).index_select(0, rows)  # [n, H]
        count = rows.numel()
        weight = torch.tensor([math.exp(-(slot - 1) / gamma)], device=slot_states.device)
        slot_loss, step_losses, draft_argmax, target_argmax, _ = _TTTSoftKL.apply(
            states,
            draft_lm_head,
            label_rows.index_select(0, rows),
            target_lm_head.detach(),
            draft_token_ids,
            torch.arange(count, device=rows.device)[None],
            torch.full((1, count), 1 / max(count, 1), device=rows.device),
            weight,
            chunk_size,
            with_grad,
        )
        hits = scored.new_zeros(batch * num_anchors)
        hits[rows] = draft_token_ids[draft_argmax[0]] == target_argmax
        losses.append(slot_loss)
        slot_losses.append(step_losses[0])
        accuracy.append(step_losses.new_tensor(0.0) if count == 0 else hits.float().sum() / count)
        tokens.append(torch.tensor(count, device=rows.device))
        correct.append(hits.view(batch, num_anchors))
        if slot == 1:
            first_scored = scored
    accepted = torch.stack(correct, dim=-1).int().cumprod(dim=-1).sum(-1).float()  # [B, A]
    return BlockLoss(
        loss=torch.stack(losses).sum(),
        slot_losses=torch.stack(slot_losses),
        slot_accuracy=torch.stack(accuracy),
        slot_tokens=torch.stack(tokens),
        acceptance_length=1 + _masked_mean(accepted, first_scored),
    )
