"""Fused draft-vocab forward-KL loss in Triton, forward and backward, with the [N, Vd] logits
never materialised. Same function and signature as `soft_kl_reference`.

Forward, one program per (block of rows, slice of the vocab): sweep the slice in tiles; each
tile's draft and target logits come from in-kernel dots over the hidden size; an online softmax
keeps, per row, the running max and sum of exp of both distributions, the running
Σ exp(t - max_t)·(t - d) (so KL = Σ p_t (t - d) - lse_t + lse_d needs no second pass) and both
running argmaxes. Programs write those per-row partials ([slices, N]); a few torch ops merge
the slices (as flash-decoding does). Slicing the vocab keeps the GPU busy when N is small.

Backward (dlogits = w · (softmax_d - softmax_t)): the grid covers one block of
`chunk_size` rows x `vocab_chunk` columns at a time, recomputing both logit tiles in-kernel from
the saved log-sum-exps and writing that block of dlogits; the two hidden-sized products
(dlogits @ Wd, dlogitsᵀ @ hidden) go to cuBLAS. Peak extra memory is one dlogits block plus fp32
gradient accumulators; none of it scales with N x Vd. Cost: the backward recomputes the logits
once (6 logit-sized matmuls in all, against 4 if [N, Vd] were kept).

Arithmetic is fp32 inside the kernels; on CUDA, bf16/fp16 operands feed tl.dot as they are
(fp32 accumulation). The Triton interpreter (TRITON_INTERPRET=1, the CPU tests) gets fp32
operands because it computes bf16 wrongly.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton import knobs

from kernels.soft_kl_reference import SoftKLOutput, check_soft_kl_inputs

VOCAB_CHUNK = 8192  # dlogits columns per backward block: bounds its memory whatever Vd is


@dataclass(frozen=True)
class KLBlocks:
    """Tile sizes: rows x vocab logits per tile, hidden columns per dot step; the forward's vocab
    slices per block of rows (None: enough programs for two per SM on CUDA, one slice on CPU)."""

    rows: int = 64
    vocab: int = 128
    hidden: int = 64
    num_warps: int = 8
    vocab_splits: int | None = None

    def __post_init__(self):
        for name in ("rows", "vocab", "hidden"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"KLBlocks.{name}={size}: tl.dot needs a power of two >= 16")
        if self.vocab_splits is not None and self.vocab_splits < 1:
            raise ValueError(f"KLBlocks.vocab_splits={self.vocab_splits} must be >= 1")


@triton.jit
def _logit_tile(
    hidden_ptr,
    weight_ptr,
    stride_hidden,
    stride_weight,
    rows,
    vocab,
    num_rows,
    vocab_size,
    hidden_size,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """hidden[rows] @ weight[vocab]ᵀ as an fp32 [BLOCK_N, BLOCK_V] tile (0 outside the bounds)."""
    logits = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    hidden_rows = hidden_ptr + rows.to(tl.int64)[:, None] * stride_hidden
    weight_rows = weight_ptr + vocab.to(tl.int64)[:, None] * stride_weight
    row_mask = (rows < num_rows)[:, None]
    vocab_mask = (vocab < vocab_size)[:, None]
    for start in range(0, hidden_size, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        col_mask = (cols < hidden_size)[None, :]
        hidden = tl.load(hidden_rows + cols[None, :], mask=row_mask & col_mask, other=0.0)
        weight = tl.load(weight_rows + cols[None, :], mask=vocab_mask & col_mask, other=0.0)
        logits = tl.dot(
            hidden.to(DOT_DTYPE), tl.trans(weight.to(DOT_DTYPE)), logits, input_precision=PRECISION
        )
    return logits


@triton.jit
def _soft_kl_partials_kernel(
    draft_hidden,
    draft_weight,
    target_hidden,
    target_weight,
    partials,
    best,
    num_rows,
    vocab_size,
    hidden_size,
    target_hidden_size,
    stride_draft_hidden,
    stride_draft_weight,
    stride_target_hidden,
    stride_target_weight,
    tiles_per_split,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DRAFT_DOT: tl.constexpr,
    TARGET_DOT: tl.constexpr,
    DRAFT_PRECISION: tl.constexpr,
    TARGET_PRECISION: tl.constexpr,
):
    """Online-softmax partials of one vocab slice: partials [5, S, N] fp32, best [2, S, N] int64."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    draft_max = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    draft_sum = tl.zeros((BLOCK_N,), tl.float32)  # Σ exp(d - draft_max)
    draft_best = tl.zeros((BLOCK_N,), tl.int32)
    target_max = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    target_sum = tl.zeros((BLOCK_N,), tl.float32)  # Σ exp(t - target_max)
    target_best = tl.zeros((BLOCK_N,), tl.int32)
    cross = tl.zeros((BLOCK_N,), tl.float32)  # Σ exp(t - target_max) · (t - d)
    first_tile = split * tiles_per_split
    last_tile = tl.minimum(first_tile + tiles_per_split, tl.cdiv(vocab_size, BLOCK_V))
    for tile in range(first_tile, last_tile):
        vocab_start = tile * BLOCK_V
        vocab = vocab_start + tl.arange(0, BLOCK_V)
        in_vocab = (vocab < vocab_size)[None, :]
        draft_logits = _logit_tile(
            draft_hidden, draft_weight, stride_draft_hidden, stride_draft_weight, rows, vocab,
            num_rows, vocab_size, hidden_size, BLOCK_N, BLOCK_V, BLOCK_H, DRAFT_DOT, DRAFT_PRECISION,
        )  # fmt: skip
        target_logits = _logit_tile(
            target_hidden, target_weight, stride_target_hidden, stride_target_weight, rows, vocab,
            num_rows, vocab_size, target_hidden_size, BLOCK_N, BLOCK_V, BLOCK_H, TARGET_DOT, TARGET_PRECISION,
        )  # fmt: skip
        log_ratio = tl.where(in_vocab, target_logits - draft_logits, 0.0)
        draft_logits = tl.where(in_vocab, draft_logits, float("-inf"))
        target_logits = tl.where(in_vocab, target_logits, float("-inf"))

        # A later tile takes the argmax only if strictly larger: ties keep the first index, as torch.
        tile_max = tl.max(draft_logits, axis=1)
        draft_best = tl.where(tile_max > draft_max, vocab_start + tl.argmax(draft_logits, axis=1), draft_best)
        new_max = tl.maximum(draft_max, tile_max)
        draft_sum = draft_sum * tl.exp(draft_max - new_max) + tl.sum(
            tl.exp(draft_logits - new_max[:, None]), axis=1
        )
        draft_max = new_max

        tile_max = tl.max(target_logits, axis=1)
        target_best = tl.where(
            tile_max > target_max, vocab_start + tl.argmax(target_logits, axis=1), target_best
        )
        new_max = tl.maximum(target_max, tile_max)
        rescale = tl.exp(target_max - new_max)
        target_exp = tl.exp(target_logits - new_max[:, None])  # 0 outside the vocab
        target_sum = target_sum * rescale + tl.sum(target_exp, axis=1)
        cross = cross * rescale + tl.sum(target_exp * log_ratio, axis=1)
        target_max = new_max

    row_mask = rows < num_rows
    field = tl.num_programs(1) * num_rows  # elements per partial field [S, N]
    out = split * num_rows + rows
    tl.store(partials + out, draft_max, mask=row_mask)
    tl.store(partials + field + out, draft_sum, mask=row_mask)
    tl.store(partials + 2 * field + out, target_max, mask=row_mask)
    tl.store(partials + 3 * field + out, target_sum, mask=row_mask)
    tl.store(partials + 4 * field + out, cross, mask=row_mask)
    tl.store(best + out, draft_best, mask=row_mask)
    tl.store(best + field + out, target_best, mask=row_mask)


@triton.jit
def _soft_kl_grad_logits_kernel(
    draft_hidden,
    draft_weight,
    target_hidden,
    target_weight,
    row_weights,
    grad_loss,
    draft_lse,
    target_lse,
    grad_logits,
    num_rows,
    vocab_size,
    hidden_size,
    target_hidden_size,
    stride_draft_hidden,
    stride_draft_weight,
    stride_target_hidden,
    stride_target_weight,
    stride_grad_logits,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DRAFT_DOT: tl.constexpr,
    TARGET_DOT: tl.constexpr,
    DRAFT_PRECISION: tl.constexpr,
    TARGET_PRECISION: tl.constexpr,
):
    """grad_logits[n, v] = grad_loss · w_n · (softmax_d - softmax_t)[n, v], 0 on rows with w_n <= 0."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    vocab = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_mask = rows < num_rows
    draft_logits = _logit_tile(
        draft_hidden, draft_weight, stride_draft_hidden, stride_draft_weight, rows, vocab,
        num_rows, vocab_size, hidden_size, BLOCK_N, BLOCK_V, BLOCK_H, DRAFT_DOT, DRAFT_PRECISION,
    )  # fmt: skip
    target_logits = _logit_tile(
        target_hidden, target_weight, stride_target_hidden, stride_target_weight, rows, vocab,
        num_rows, vocab_size, target_hidden_size, BLOCK_N, BLOCK_V, BLOCK_H, TARGET_DOT, TARGET_PRECISION,
    )  # fmt: skip
    draft_probs = tl.exp(draft_logits - tl.load(draft_lse + rows, mask=row_mask, other=0.0)[:, None])
    target_probs = tl.exp(target_logits - tl.load(target_lse + rows, mask=row_mask, other=0.0)[:, None])
    weights = tl.load(row_weights + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    scale = weights * tl.load(grad_loss).to(tl.float32)
    grad = tl.where(weights > 0, scale * (draft_probs - target_probs), 0.0)
    out_mask = row_mask[:, None] & (vocab < vocab_size)[None, :]
    out = grad_logits + rows.to(tl.int64)[:, None] * stride_grad_logits + vocab[None, :]
    tl.store(out, grad.to(grad_logits.dtype.element_ty), mask=out_mask)


_DOT_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _dot_operands(tensor: torch.Tensor) -> tuple[tl.dtype, str]:
    """tl.dot operand dtype and fp32 precision for an input pair of this dtype."""
    if tensor.dtype not in _DOT_DTYPES:
        raise ValueError(f"fused_soft_kl: dtype {tensor.dtype} unsupported; use float32, bfloat16 or float16")
    if knobs.runtime.interpret or tensor.dtype == torch.float32:
        # fp32 dots follow torch's own TF32 switch, so kernel and reference round alike.
        tf32 = tensor.is_cuda and torch.backends.cuda.matmul.allow_tf32
        return tl.float32, "tf32" if tf32 else "ieee"
    return _DOT_DTYPES[tensor.dtype], "tf32"  # ignored for bf16/fp16 operands


def _kernel_args(
    draft_hidden: torch.Tensor,
    draft_weight: torch.Tensor,
    target_hidden: torch.Tensor,
    target_weight: torch.Tensor,
    blocks: KLBlocks,
) -> dict:
    """Sizes, row strides and tile constants shared by both kernels (inputs have unit column stride)."""
    draft_dot, draft_precision = _dot_operands(draft_hidden)
    target_dot, target_precision = _dot_operands(target_hidden)
    return dict(
        num_rows=draft_hidden.shape[0],
        vocab_size=draft_weight.shape[0],
        hidden_size=draft_hidden.shape[1],
        target_hidden_size=target_hidden.shape[1],
        stride_draft_hidden=draft_hidden.stride(0),
        stride_draft_weight=draft_weight.stride(0),
        stride_target_hidden=target_hidden.stride(0),
        stride_target_weight=target_weight.stride(0),
        BLOCK_N=blocks.rows,
        BLOCK_V=blocks.vocab,
        BLOCK_H=blocks.hidden,
        DRAFT_DOT=draft_dot,
        TARGET_DOT=target_dot,
        DRAFT_PRECISION=draft_precision,
        TARGET_PRECISION=target_precision,
        num_warps=blocks.num_warps,
    )


def _vocab_slices(num_rows: int, vocab_size: int, blocks: KLBlocks, device: torch.device) -> tuple[int, int]:
    """(vocab tiles per slice, slices) for the forward; no slice is empty."""
    tiles = triton.cdiv(vocab_size, blocks.vocab)
    wanted = blocks.vocab_splits
    if wanted is None:
        programs = (
            2 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        )
        wanted = triton.cdiv(programs, triton.cdiv(max(num_rows, 1), blocks.rows))
    tiles_per_split = triton.cdiv(tiles, min(wanted, tiles))
    return tiles_per_split, triton.cdiv(tiles, tiles_per_split)


def _merge_slices(
    partials: torch.Tensor, best: torch.Tensor, row_weights: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Per-slice partials [5, S, N] and argmaxes [2, S, N] -> row_kl, draft_lse, target_lse [N]
    and draft_argmax, target_argmax [N] (on the device, no sync)."""
    draft_max, draft_sum, target_max, target_sum, cross = partials  # each [S, N]
    draft_top = draft_max.max(0)  # ties: the first slice, i.e. the lowest vocab index, as torch's argmax
    draft_lse = draft_top.values + (draft_sum * (draft_max - draft_top.values).exp()).sum(0).log()
    target_top = target_max.max(0)
    rescale = (target_max - target_top.values).exp()  # [S, N]
    target_total = (target_sum * rescale).sum(0)
    target_lse = target_top.values + target_total.log()
    kl = (cross * rescale).sum(0) / target_total - target_lse + draft_lse
    # Masked rows add nothing, not even a NaN.
    row_kl = torch.where(row_weights > 0, row_weights.float() * kl, 0)
    draft_argmax = best[0].gather(0, draft_top.indices[None])[0]
    target_argmax = best[1].gather(0, target_top.indices[None])[0]
    return row_kl, draft_lse, target_lse, draft_argmax, target_argmax


class _FusedSoftKL(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        draft_hidden,
        draft_weight,
        target_hidden,
        target_weight,
        row_weights,
        chunk_size,
        vocab_chunk,
        blocks,
    ):
        num_rows, vocab_size = draft_hidden.shape[0], draft_weight.shape[0]
        tiles_per_split, splits = _vocab_slices(num_rows, vocab_size, blocks, draft_hidden.device)
        partials = draft_hidden.new_empty((5, splits, num_rows), dtype=torch.float32)
        best = draft_hidden.new_empty((2, splits, num_rows), dtype=torch.int64)
        if num_rows:
            _soft_kl_partials_kernel[(triton.cdiv(num_rows, blocks.rows), splits)](
                draft_hidden, draft_weight, target_hidden, target_weight, partials, best,
                **_kernel_args(draft_hidden, draft_weight, target_hidden, target_weight, blocks),
                tiles_per_split=tiles_per_split,
            )  # fmt: skip
        row_kl, draft_lse, target_lse, draft_argmax, target_argmax = _merge_slices(
            partials, best, row_weights
        )
        ctx.save_for_backward(
            draft_hidden, draft_weight, target_hidden, target_weight, row_weights, draft_lse, target_lse
        )
        ctx.chunk_size, ctx.vocab_chunk, ctx.blocks = chunk_size, vocab_chunk, blocks
        ctx.mark_non_differentiable(draft_argmax, target_argmax)
        return row_kl.sum(), draft_argmax, target_argmax

    @staticmethod
    def backward(ctx, grad_loss, _grad_draft_argmax, _grad_target_argmax):
        draft_hidden, draft_weight, target_hidden, target_weight, row_weights, draft_lse, target_lse = (
            ctx.saved_tensors
        )
        need_hidden_grad, need_weight_grad = ctx.needs_input_grad[:2]
        num_rows, hidden_size = draft_hidden.shape
        vocab_size = draft_weight.shape[0]
        device = draft_hidden.device
        grad_hidden = (
            torch.zeros(num_rows, hidden_size, dtype=torch.float32, device=device)
            if need_hidden_grad
            else None
        )
        grad_weight = torch.empty_like(draft_weight) if need_weight_grad else None
        # Rows outside the mask get dlogits = 0, but 0 x NaN would still poison the weight gradient.
        used_hidden = draft_hidden.masked_fill((row_weights <= 0)[:, None], 0) if need_weight_grad else None
        block = torch.empty(
            min(ctx.chunk_size, num_rows),
            min(ctx.vocab_chunk, vocab_size),
            dtype=draft_weight.dtype,
            device=device,
        )  # [rows, vocab] of dlogits, reused by every block
        args = _kernel_args(draft_hidden, draft_weight, target_hidden, target_weight, ctx.blocks)
        grad_loss = grad_loss.reshape(1)
        for vocab_start in range(0, vocab_size, ctx.vocab_chunk):
            vocab = slice(vocab_start, vocab_start + ctx.vocab_chunk)
            weight_rows = draft_weight[vocab]  # [v, H]
            weight_rows_grad = (
                torch.zeros(weight_rows.shape, dtype=torch.float32, device=device)
                if need_weight_grad
                else None
            )
            for row_start in range(0, num_rows, ctx.chunk_size):
                rows = slice(row_start, row_start + ctx.chunk_size)
                grad_logits = block[: draft_hidden[rows].shape[0], : weight_rows.shape[0]]  # [n, v]
                grid = (
                    triton.cdiv(grad_logits.shape[0], ctx.blocks.rows),
                    triton.cdiv(grad_logits.shape[1], ctx.blocks.vocab),
                )
                _soft_kl_grad_logits_kernel[grid](
                    draft_hidden[rows], weight_rows, target_hidden[rows], target_weight[vocab],
                    row_weights[rows], grad_loss, draft_lse[rows], target_lse[rows], grad_logits,
                    **{**args, "num_rows": grad_logits.shape[0], "vocab_size": grad_logits.shape[1]},
                    stride_grad_logits=grad_logits.stride(0),
                )  # fmt: skip
                if need_hidden_grad:
                    grad_hidden[rows] += (grad_logits @ weight_rows).float()
                if need_weight_grad:
                    weight_rows_grad += (grad_logits.T @ used_hidden[rows]).float()
            if need_weight_grad:
                grad_weight[vocab] = weight_rows_grad
        if need_hidden_grad:
            grad_hidden = grad_hidden.to(draft_hidden.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def _unit_column_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def fused_soft_kl(
    draft_hidden: torch.Tensor,
    draft_weight: torch.Tensor,
    target_hidden: torch.Tensor,
    target_weight: torch.Tensor,
    row_weights: torch.Tensor,
    chunk_size: int,
    *,
    vocab_chunk: int = VOCAB_CHUNK,
    blocks: KLBlocks | None = None,
) -> SoftKLOutput:
    """Σ_n row_weights[n] · KL(target || draft) over the draft vocab, plus both argmaxes.

    draft_hidden [N, H], draft_weight [Vd, H], target_hidden [N, Ht], target_weight [Vd, Ht],
    row_weights [N]. chunk_size: rows per backward block (the forward streams every row);
    vocab_chunk: vocab columns per backward block. Gradients flow to draft_hidden and
    draft_weight only. CUDA tensors, or CPU tensors under TRITON_INTERPRET=1.
    """
    check_soft_kl_inputs(draft_hidden, draft_weight, target_hidden, target_weight, row_weights, chunk_size)
    if vocab_chunk < 1:
        raise ValueError(f"fused_soft_kl: vocab_chunk={vocab_chunk} must be >= 1")
    return SoftKLOutput(
        *_FusedSoftKL.apply(
            _unit_column_stride(draft_hidden),
            _unit_column_stride(draft_weight),
            _unit_column_stride(target_hidden.detach()),
            _unit_column_stride(target_weight.detach()),
            row_weights.detach().contiguous(),
            chunk_size,
            vocab_chunk,
            blocks or KLBlocks(),
        )
    )
