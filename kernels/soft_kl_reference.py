"""Torch reference of the draft-vocab forward-KL loss: the definition `kernels/fused_kl.py`
is tested against, and the implementation used off CUDA.

loss = Σ_n row_weights[n] · KL(softmax(target_hidden[n] Wtᵀ) || softmax(draft_hidden[n] Wdᵀ)),
both softmaxes over the same (draft) vocab, so the target distribution is renormalised over it.
Rows are processed `chunk_size` at a time and the gradients are built chunk by chunk during the
forward (the loss is a scalar; the backward only scales them), so no more than one chunk of
logits exists at any time. It lives apart from the kernel so it imports without Triton.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F


class SoftKLOutput(NamedTuple):
    loss: torch.Tensor  # fp32 scalar Σ_n row_weights[n] · KL_n (rows with weight 0 add nothing)
    draft_argmax: torch.Tensor  # int64 [N], index into draft_weight's rows
    target_argmax: torch.Tensor  # int64 [N], index into target_weight's rows


def check_soft_kl_inputs(
    draft_hidden: torch.Tensor,
    draft_weight: torch.Tensor,
    target_hidden: torch.Tensor,
    target_weight: torch.Tensor,
    row_weights: torch.Tensor,
    chunk_size: int,
) -> None:
    """Shape and device checks shared by the reference and the kernel (no host sync)."""
    for name, tensor in [
        ("draft_hidden", draft_hidden),
        ("draft_weight", draft_weight),
        ("target_hidden", target_hidden),
        ("target_weight", target_weight),
    ]:
        if tensor.dim() != 2:
            raise ValueError(f"soft_kl: {name} must be 2-D, got shape {tuple(tensor.shape)}")
        if tensor.device != draft_hidden.device:
            raise ValueError(f"soft_kl: {name} is on {tensor.device}, draft_hidden on {draft_hidden.device}")
    num_rows, vocab_size = draft_hidden.shape[0], draft_weight.shape[0]
    if draft_hidden.shape[1] != draft_weight.shape[1]:
        raise ValueError(
            f"soft_kl: draft_hidden {tuple(draft_hidden.shape)} and draft_weight "
            f"{tuple(draft_weight.shape)} disagree on the hidden size"
        )
    if target_hidden.shape[1] != target_weight.shape[1]:
        raise ValueError(
            f"soft_kl: target_hidden {tuple(target_hidden.shape)} and target_weight "
            f"{tuple(target_weight.shape)} disagree on the hidden size"
        )
    if target_hidden.shape[0] != num_rows or row_weights.shape != (num_rows,):
        raise ValueError(
            f"soft_kl: draft_hidden has {num_rows} rows, target_hidden {target_hidden.shape[0]}, "
            f"row_weights shape {tuple(row_weights.shape)}"
        )
    if target_weight.shape[0] != vocab_size:
        raise ValueError(
            f"soft_kl: draft_weight has {vocab_size} rows, target_weight {target_weight.shape[0]}: "
            "both must cover the same vocab"
        )
    if chunk_size < 1:
        raise ValueError(f"soft_kl: chunk_size={chunk_size} must be >= 1")


class _SoftKLReference(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, draft_hidden, draft_weight, target_hidden, target_weight, row_weights, chunk_size, with_grad
    ):
        need_hidden_grad = with_grad and ctx.needs_input_grad[0]
        need_weight_grad = with_grad and ctx.needs_input_grad[1]
        device = draft_hidden.device
        num_rows = draft_hidden.shape[0]
        loss = torch.zeros((), dtype=torch.float32, device=device)
        draft_argmax = torch.empty(num_rows, dtype=torch.int64, device=device)
        target_argmax = torch.empty_like(draft_argmax)
        grad_hidden = torch.zeros_like(draft_hidden) if need_hidden_grad else None
        grad_weight = (
            torch.zeros(draft_weight.shape, dtype=torch.float32, device=device) if need_weight_grad else None
        )
        for start in range(0, num_rows, chunk_size):
            rows = slice(start, start + chunk_size)
            hidden = draft_hidden[rows]  # [n, H]
            draft_logits = (hidden @ draft_weight.T).float()  # [n, Vd]
            target_logits = (target_hidden[rows] @ target_weight.T).float()  # [n, Vd]
            draft_logprobs = F.log_softmax(draft_logits, dim=-1)
            target_logprobs = F.log_softmax(target_logits, dim=-1)
            target_probs = target_logprobs.exp()
            weights = row_weights[rows].float()[:, None]  # [n, 1]
            used = weights > 0  # rows outside the mask add nothing, not even a NaN
            kl_rows = (target_probs * (target_logprobs - draft_logprobs)).sum(-1, keepdim=True)
            loss += torch.where(used, kl_rows * weights, 0).sum()
            draft_argmax[rows] = draft_logits.argmax(-1)
            target_argmax[rows] = target_logits.argmax(-1)
            if need_hidden_grad or need_weight_grad:
                grad_logits = torch.where(used, (draft_logprobs.exp() - target_probs) * weights, 0)  # [n, Vd]
                if need_hidden_grad:
                    grad_hidden[rows] = (grad_logits.to(draft_weight.dtype) @ draft_weight).to(
                        grad_hidden.dtype
                    )
                if need_weight_grad:
                    used_hidden = torch.where(used, hidden, 0)  # 0 x NaN would still be NaN
                    grad_weight += (grad_logits.T.to(hidden.dtype) @ used_hidden).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = draft_weight.dtype
        ctx.mark_non_differentiable(draft_argmax, target_argmax)
        return loss, draft_argmax, target_argmax

    @staticmethod
    def backward(ctx, grad_loss, _grad_draft_argmax, _grad_target_argmax):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_grad = grad_hidden * grad_loss if grad_hidden is not None else None
        weight_grad = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return hidden_grad, weight_grad, None, None, None, None, None


def soft_kl_reference(
    draft_hidden: torch.Tensor,
    draft_weight: torch.Tensor,
    target_hidden: torch.Tensor,
    target_weight: torch.Tensor,
    row_weights: torch.Tensor,
    chunk_size: int,
) -> SoftKLOutput:
    """Σ_n row_weights[n] · KL(target || draft) over the draft vocab, plus both argmaxes.

    draft_hidden [N, H], draft_weight [Vd, H], target_hidden [N, Ht], target_weight [Vd, Ht]
    (the target lm_head's draft-vocab rows), row_weights [N] (mask x step weight).
    Gradients flow to draft_hidden and draft_weight; the target side is constant.
    """
    check_soft_kl_inputs(draft_hidden, draft_weight, target_hidden, target_weight, row_weights, chunk_size)
    # Grad mode is off inside an autograd.Function's forward, so decide here whether to build gradients.
    with_grad = torch.is_grad_enabled() and (draft_hidden.requires_grad or draft_weight.requires_grad)
    return SoftKLOutput(
        *_SoftKLReference.apply(
            draft_hidden,
            draft_weight,
            target_hidden.detach(),
            target_weight.detach(),
            row_weights.detach(),
            chunk_size,
            with_grad,
        )
    )
