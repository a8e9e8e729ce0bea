"""Tree verification in Triton: a batch of draft trees, greedy or sampled, in one launch. Same
function and signature as `tree_verify_reference` (read its docstring for the semantics and the
random-number contract).

One program per block of requests (one request per program on CUDA, so each walks on its own
SM; many per program under the interpreter, where programs run one after another). A program
walks its requests' trees from the root, and touches the vocabulary only at the nodes it
visits, a tile at a time, never holding a [V] row:
- node entry: greedy, the target argmax (one pass); sampling, the processed target
  distribution's statistics: max and normaliser (one online-softmax pass), the top-k threshold
  and the top-p cutoff as order keys (a radix search of 8 passes each, when enabled).
- a child is tested pointwise: p(x) and q(x) after this node's rejections so far, recomputed
  from the node's logits and draft row through the chain p <- max(p - q, 0) / A_j,
  q <- q * [v != x_j] / B_j; only the normalisers A_j, B_j and rejected tokens x_j are kept.
- a rejection costs one pass (the new A and B); the emitted token one pass (the race).
Arithmetic is fp32 whatever the input dtype; divisions are correctly rounded (div_rn) so that
the thresholds (temperature, top-k) come out bit for bit as in the torch reference.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.tree_verify_reference import TreePath, check_verify_args

INT32_MIN = tl.constexpr(-(2**31))  # order keys are int32: the lowest and the highest
INT32_MAX = tl.constexpr(2**31 - 1)
SEARCH_DIGITS = tl.constexpr(16)  # candidates per threshold-search pass (4 bits of the 32-bit key)
MAX_TILE = 1 << 20  # Triton's largest tensor: bounds rows x SEARCH_DIGITS x vocab per tile


@dataclass(frozen=True)
class VerifyBlocks:
    """Requests per program and vocabulary entries per tile (None: 1 request on CUDA, as many as
    fit `interpreter_elements` per tile on CPU under the interpreter)."""

    rows: int | None = None
    vocab: int = 1024
    interpreter_elements: int = 1 << 15
    num_warps: int = 8

    def __post_init__(self):
        for name in ("rows", "vocab"):
            size = getattr(self, name)
            if size is not None and (size < 1 or size & (size - 1)):
                raise ValueError(f"VerifyBlocks.{name}={size}: must be a power of two")


@triton.jit
def _order_key(x):
    """fp32 -> int32 order key (x < y iff key(x) < key(y); -0 and +0 share one), for the searches."""
    bits = tl.where(x == 0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _scaled_logits(logits_rows, node_offsets, live, start, vocab_size, temperature, BLOCK_V: tl.constexpr):
    """Logits / temperature of one vocab tile at each row's node -> (x [B, V] fp32, its order keys,
    in_vocab, vocab ids [1, V]). logits_rows [B]: each request's logits; node_offsets [B]: its
    node's offset in them."""
    vocab = start + tl.arange(0, BLOCK_V).to(tl.int64)
    in_vocab = live[:, None] & (vocab < vocab_size)[None, :]
    pointers = (logits_rows + node_offsets)[:, None] + vocab[None, :]
    logits = tl.load(pointers, mask=in_vocab, other=float("-inf"))
    x = tl.math.div_rn(logits.to(tl.float32), temperature)
    bits = tl.where(x == 0, 0.0, x).to(tl.int32, bitcast=True)  # _order_key, inlined: the interpreter
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # pays for every nested call
    return x, key, in_vocab, vocab[None, :]


@triton.jit
def _target_argmax(logits_rows, node_offsets, live, vocab_size, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """Greedy choice at each row's node: the first index of the largest logit."""
    best = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    best_index = tl.zeros((BLOCK_B,), tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        x, _, _, _ = _scaled_logits(logits_rows, node_offsets, live, start, vocab_size, 1.0, BLOCK_V)
        tile_best = tl.max(x, axis=1)
        tile_index = tl.argmax(x, axis=1, tie_break_left=True).to(tl.int64) + start
        better = tile_best > best  # strict: an earlier tile keeps ties
        best = tl.where(better, tile_best, best)
        best_index = tl.where(better, tile_index, best_index)
    return best_index


@triton.jit
def _key_search(
    logits_rows, node_offsets, live, vocab_size, temperature, row_max, floor_key, target,
    MASS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Per row, the largest order key t with S(t) >= target, where S(t) = #{v: key_v >= t}
    (MASS False) or the sum of exp(x_v - max) over key_v > t, key_v >= floor_key (MASS True).
    S falls as t rises, so a radix search finds t: 4 bits per pass, 16 candidates at once, 8
    passes over the vocabulary. S(INT32_MIN) >= target is the caller's to ensure. The search
    runs in int64 (candidates pass INT32_MAX), the [B, 16, V] comparisons in int32."""
    digits = tl.arange(0, SEARCH_DIGITS).to(tl.int64)[None, :, None]  # [1, 16, 1]
    low = tl.full((BLOCK_B,), INT32_MIN, tl.int64)
    for shift in range(28, -4, -4):
        # Past INT32_MAX no key lies above: clamping keeps S(candidate) (0 for any live row).
        candidates = tl.minimum(low[:, None, None] + (digits << shift), INT32_MAX).to(tl.int32)  # [B, 16, 1]
        total = tl.zeros((BLOCK_B, SEARCH_DIGITS), tl.float32)
        for start in range(0, vocab_size, BLOCK_V):
            x, key, in_vocab, _ = _scaled_logits(
                logits_rows, node_offsets, live, start, vocab_size, temperature, BLOCK_V
            )
            if MASS:
                weight = tl.where(in_vocab & (key >= floor_key[:, None]), tl.exp(x - row_max[:, None]), 0.0)
                total += tl.sum(tl.where(key[:, None, :] > candidates, weight[:, None, :], 0.0), axis=2)
            else:
                total += tl.sum(
                    (in_vocab[:, None, :] & (key[:, None, :] >= candidates)).to(tl.float32), axis=2
                )
        holding = tl.sum((total >= target[:, None]).to(tl.int64), axis=1)  # digits 0 .. holding - 1 hold
        low += tl.maximum(holding - 1, 0) << shift
    return low  # int64: in int32 range for live rows


@triton.jit
def _target_stats(
    logits_rows, node_offsets, live, vocab_size, temperature, top_k, top_p,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """The processed target distribution at each row's node, as p(v) = exp(x_v - max) / norm
    where key(x_v) >= kept_key, else 0 -> (max, norm, kept_key)."""
    kept_key = tl.full((BLOCK_B,), INT32_MIN, tl.int32)
    if TOP_K:  # the k-th largest scaled logit, ties kept (as HF's top-k warper)
        count = tl.full((BLOCK_B,), top_k, tl.float32)
        kept_key = _key_search(  # counting: the max and floor arguments are not read
            logits_rows, node_offsets, live, vocab_size, temperature, count, kept_key, count, False, BLOCK_B, BLOCK_V
        ).to(tl.int32)  # fmt: skip
    row_max = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    norm = tl.zeros((BLOCK_B,), tl.float32)
    for start in range(0, vocab_size, BLOCK_V):  # online softmax over the top-k survivors
        x, key, in_vocab, _ = _scaled_logits(
            logits_rows, node_offsets, live, start, vocab_size, temperature, BLOCK_V
        )
        kept = in_vocab & (key >= kept_key[:, None])
        new_max = tl.maximum(row_max, tl.max(tl.where(kept, x, float("-inf")), axis=1))
        finite_max = tl.where(new_max > float("-inf"), new_max, 0.0)  # no -inf - -inf below
        norm = norm * tl.exp(row_max - finite_max)
        norm += tl.sum(tl.where(kept, tl.exp(x - finite_max[:, None]), 0.0), axis=1)
        row_max = new_max
    row_max = tl.where(row_max > float("-inf"), row_max, 0.0)  # rows not entering: any finite value
    if TOP_P:
        # Keep v iff the mass strictly above it is < top_p (the top token always stays): the
        # kept set is {key > t} for the largest t whose mass above is still >= top_p.
        mass_above = _key_search(
            logits_rows, node_offsets, live, vocab_size, temperature, row_max, kept_key, top_p * norm, True,
            BLOCK_B, BLOCK_V,
        )  # fmt: skip
        kept_key = tl.maximum(kept_key, tl.minimum(mass_above + 1, INT32_MAX).to(tl.int32))
        norm = tl.zeros((BLOCK_B,), tl.float32)
        for start in range(0, vocab_size, BLOCK_V):
            x, key, in_vocab, _ = _scaled_logits(
                logits_rows, node_offsets, live, start, vocab_size, temperature, BLOCK_V
            )
            norm += tl.sum(
                tl.where(in_vocab & (key >= kept_key[:, None]), tl.exp(x - row_max[:, None]), 0.0), axis=1
            )
    return row_max, norm, kept_key


@triton.jit
def _target_probs(x, key, in_vocab, row_max, norm, kept_key):
    """p at scaled logits x [B, W] (order keys key) from the node statistics [B]."""
    kept = in_vocab & (key >= kept_key[:, None])
    safe_norm = tl.where(norm > 0, norm, 1.0)[:, None]  # 0 only in rows not computed
    return tl.where(kept, tl.math.div_rn(tl.exp(x - row_max[:, None]), safe_norm), 0.0)


@triton.jit
def _after_rejections(
    target, draft, vocab, num_rejected, residual_norms, draft_norms, rejected_tokens, BLOCK_C: tl.constexpr
):
    """p, q [B, W] at token ids vocab after each row's first num_rejected rejections at this node:
    p <- max(p - q, 0) / A_j (kept when A_j = 0), q <- q * [v != x_j] / B_j (when B_j > 0)."""
    slots = tl.arange(0, BLOCK_C)[None, :]
    for j in range(0, tl.max(num_rejected)):
        pick = slots == j
        residual_norm = tl.sum(tl.where(pick, residual_norms, 0.0), axis=1)[:, None]
        draft_norm = tl.sum(tl.where(pick, draft_norms, 0.0), axis=1)[:, None]
        rejected_token = tl.sum(tl.where(pick, rejected_tokens, 0), axis=1)[:, None]
        step = (j < num_rejected)[:, None]
        residual = tl.maximum(target - draft, 0.0)
        new_target = tl.where(
            residual_norm > 0,
            tl.math.div_rn(residual, tl.where(residual_norm > 0, residual_norm, 1.0)),
            target,
        )
        untried = tl.where(vocab == rejected_token, 0.0, draft)
        new_draft = tl.where(
            draft_norm > 0, tl.math.div_rn(untried, tl.where(draft_norm > 0, draft_norm, 1.0)), untried
        )
        target = tl.where(step, new_target, target)
        draft = tl.where(step, new_draft, draft)
    return target, draft


@triton.jit
def _node_tile(
    logits_rows, draft_rows, current, stride_logits_node, stride_draft_node, live, start, vocab_size, temperature,
    row_max, norm, kept_key, num_rejected, residual_norms, draft_norms, rejected_tokens,
    BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """p and q over one vocab tile at each row's current node, after its rejections so far
    -> (p [B, V], q [B, V], in_vocab, vocab ids [1, V])."""
    x, key, in_vocab, vocab = _scaled_logits(
        logits_rows, current * stride_logits_node, live, start, vocab_size, temperature, BLOCK_V
    )
    target = _target_probs(x, key, in_vocab, row_max, norm, kept_key)
    draft_pointers = (draft_rows + current * stride_draft_node)[:, None] + vocab
    draft = tl.load(draft_pointers, mask=in_vocab, other=0.0).to(tl.float32)
    target, draft = _after_rejections(
        target, draft, vocab, num_rejected, residual_norms, draft_norms, rejected_tokens, BLOCK_C
    )
    return target, draft, in_vocab, vocab


@triton.jit
def _rejection_norms(
    logits_rows, draft_rows, current, stride_logits_node, stride_draft_node, rejected, token, vocab_size,
    temperature, row_max, norm, kept_key, num_rejected, residual_norms, draft_norms, rejected_tokens,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """After rejecting token [B] at the current node: the normalisers of the next p and q,
    A = sum of max(p - q, 0) and B = sum of q without the token (rows in `rejected`)."""
    residual_norm = tl.zeros((BLOCK_B,), tl.float32)
    draft_norm = tl.zeros((BLOCK_B,), tl.float32)
    for start in range(0, vocab_size, BLOCK_V):
        target, draft, _, vocab = _node_tile(
            logits_rows, draft_rows, current, stride_logits_node, stride_draft_node, rejected, start, vocab_size,
            temperature, row_max, norm, kept_key, num_rejected, residual_norms, draft_norms, rejected_tokens,
            BLOCK_V, BLOCK_C,
        )  # fmt: skip
        residual_norm += tl.sum(tl.maximum(target - draft, 0.0), axis=1)
        draft_norm += tl.sum(tl.where(vocab == token[:, None], 0.0, draft), axis=1)
    return residual_norm, draft_norm


@triton.jit
def _race(
    logits_rows, draft_rows, race_rows, current, stride_logits_node, stride_draft_node, live, vocab_size,
    temperature, row_max, norm, kept_key, num_rejected, residual_norms, draft_norms, rejected_tokens,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The emitted token: argmax of p / -log(u) over the vocabulary (lowest id on ties), p the
    final distribution at each row's node, u its race uniforms (race_rows [B] pointers)."""
    best = tl.full((BLOCK_B,), -1.0, tl.float32)
    best_index = tl.zeros((BLOCK_B,), tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        target, _, in_vocab, vocab = _node_tile(
            logits_rows, draft_rows, current, stride_logits_node, stride_draft_node, live, start, vocab_size,
            temperature, row_max, norm, kept_key, num_rejected, residual_norms, draft_norms, rejected_tokens,
            BLOCK_V, BLOCK_C,
        )  # fmt: skip
        race = tl.load(race_rows[:, None] + vocab, mask=in_vocab, other=0.5).to(tl.float32)
        ratio = tl.where(in_vocab, tl.math.div_rn(target, -tl.log(race)), -1.0)
        tile_best = tl.max(ratio, axis=1)
        tile_index = tl.argmax(ratio, axis=1, tie_break_left=True).to(tl.int64) + start
        better = tile_best > best  # strict: an earlier tile keeps ties
        best = tl.where(better, tile_best, best)
        best_index = tl.where(better, tile_index, best_index)
    return best_index


@triton.jit
def _tree_verify_kernel(
    children, tokens, target_logits, draft_probs, uniforms,
    accept_lens, next_tokens, paths,
    batch, num_nodes, vocab_size, max_depth, max_children,
    temperature, top_k, top_p,
    stride_children_batch, stride_children_node, stride_children_slot, stride_tokens,
    stride_logits_batch, stride_logits_node, stride_draft_batch, stride_draft_node, stride_uniforms, stride_paths,
    GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B).to(tl.int64)
    live = rows < batch
    current = tl.zeros((BLOCK_B,), tl.int64)  # accepted node
    accept_len = tl.zeros((BLOCK_B,), tl.int64)
    path = tl.full((BLOCK_B, BLOCK_D), -1, tl.int64)
    depth_slots = tl.arange(0, BLOCK_D)[None, :]
    slots = tl.arange(0, BLOCK_C)[None, :]
    logits_rows = target_logits + rows * stride_logits_batch
    draft_rows = draft_probs + rows * stride_draft_batch

    # Node state. Greedy: the argmax. Sampling: the target statistics and this node's rejections.
    choice = tl.zeros((BLOCK_B,), tl.int64)
    row_max = tl.zeros((BLOCK_B,), tl.float32)
    norm = tl.zeros((BLOCK_B,), tl.float32)
    kept_key = tl.zeros((BLOCK_B,), tl.int32)
    num_rejected = tl.zeros((BLOCK_B,), tl.int32)
    residual_norms = tl.zeros((BLOCK_B, BLOCK_C), tl.float32)
    draft_norms = tl.zeros((BLOCK_B, BLOCK_C), tl.float32)
    rejected_tokens = tl.zeros((BLOCK_B, BLOCK_C), tl.int64)

    # One iteration per depth: rows that accepted a node last time (all rows at the root) enter
    # it, then try its children. The node entry appears once in the loop: it is the costly part
    # to compile, and the last accepted node needs it too (for the bonus token).
    entering = live
    while tl.max(entering.to(tl.int32)) > 0:
        if GREEDY:
            entered = _target_argmax(
                logits_rows, current * stride_logits_node, entering, vocab_size, BLOCK_B, BLOCK_V
            )
            choice = tl.where(entering, entered, choice)
        else:
            entered_max, entered_norm, entered_key = _target_stats(
                logits_rows, current * stride_logits_node, entering, vocab_size, temperature, top_k, top_p,
                TOP_K, TOP_P, BLOCK_B, BLOCK_V,
            )  # fmt: skip
            row_max = tl.where(entering, entered_max, row_max)
            norm = tl.where(entering, entered_norm, norm)
            kept_key = tl.where(entering, entered_key, kept_key)
            num_rejected = tl.where(entering, 0, num_rejected)
        moved = tl.zeros((BLOCK_B,), tl.int1)
        looking = entering & (accept_len < max_depth)  # rows with children left to try at their node
        sibling = 0
        while (sibling < max_children) & (tl.max(looking.to(tl.int32)) > 0):
            child = tl.load(
                children + rows * stride_children_batch + current * stride_children_node
                + sibling * stride_children_slot,
                mask=looking, other=-1,
            ).to(tl.int64)  # fmt: skip
            looking &= child >= 0  # children lists are packed: the first -1 ends one
            trying = looking & (child < num_nodes)
            token = tl.load(tokens + rows * stride_tokens + child, mask=trying, other=-1).to(tl.int64)
            trying &= (token >= 0) & (token < vocab_size)
            if GREEDY:
                accepted = trying & (token == choice)
            else:
                # p(x) and q(x) at this node after its rejections so far, as [B, 1] tiles.
                token_logit = tl.load(
                    logits_rows + current * stride_logits_node + token, mask=trying, other=float("-inf")
                )
                token_logit = tl.math.div_rn(token_logit.to(tl.float32), temperature)[:, None]
                target_token = _target_probs(
                    token_logit, _order_key(token_logit), trying[:, None], row_max, norm, kept_key
                )
                draft_token = tl.load(
                    draft_rows + current * stride_draft_node + token, mask=trying, other=0.0
                )
                target_token, draft_token = _after_rejections(
                    target_token, draft_token.to(tl.float32)[:, None], token[:, None], num_rejected,
                    residual_norms, draft_norms, rejected_tokens, BLOCK_C,
                )  # fmt: skip
                target_token, draft_token = tl.sum(target_token, axis=1), tl.sum(draft_token, axis=1)
                trying &= draft_token > 0
                coin = tl.load(uniforms + rows * stride_uniforms + child, mask=trying, other=1.0)
                accepted = trying & (coin * draft_token < target_token)
                rejected = trying & ~accepted
                if tl.max(rejected.to(tl.int32)) > 0:
                    residual_norm, draft_norm = _rejection_norms(
                        logits_rows, draft_rows, current, stride_logits_node, stride_draft_node, rejected, token,
                        vocab_size, temperature, row_max, norm, kept_key,
                        num_rejected, residual_norms, draft_norms, rejected_tokens, BLOCK_B, BLOCK_V, BLOCK_C,
                    )  # fmt: skip
                    record = rejected[:, None] & (slots == num_rejected[:, None])
                    residual_norms = tl.where(record, residual_norm[:, None], residual_norms)
                    draft_norms = tl.where(record, draft_norm[:, None], draft_norms)
                    rejected_tokens = tl.where(record, token[:, None], rejected_tokens)
                    num_rejected += rejected.to(tl.int32)
            moved |= accepted
            looking &= ~accepted
            current = tl.where(accepted, child, current)
            sibling += 1
        path = tl.where((depth_slots == accept_len[:, None]) & moved[:, None], current[:, None], path)
        accept_len += moved.to(tl.int64)
        entering = moved

    if not GREEDY:  # the emitted token: an exponential race over the final p
        choice = _race(
            logits_rows, draft_rows, uniforms + rows * stride_uniforms + num_nodes, current, stride_logits_node,
            stride_draft_node, live, vocab_size, temperature, row_max, norm, kept_key,
            num_rejected, residual_norms, draft_norms, rejected_tokens, BLOCK_B, BLOCK_V, BLOCK_C,
        )  # fmt: skip

    tl.store(accept_lens + rows, accept_len, mask=live)
    tl.store(next_tokens + rows, choice, mask=live)
    tl.store(
        paths + rows[:, None] * stride_paths + depth_slots,
        path,
        mask=live[:, None] & (depth_slots < max_depth),
    )


def _block_rows(blocks: VerifyBlocks, batch: int, block_vocab: int, device: torch.device) -> int:
    if blocks.rows is not None:
        return blocks.rows
    if device.type == "cuda":
        return 1
    return max(1, min(triton.next_power_of_2(batch), blocks.interpreter_elements // block_vocab))


def tree_verify_triton(
    children: torch.Tensor,
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor | None,
    max_depth: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    *,
    blocks: VerifyBlocks = VerifyBlocks(),
) -> TreePath:
    """Verify a batch of draft trees in one launch (see `tree_verify_reference`). CUDA tensors, or
    CPU under TRITON_INTERPRET=1."""
    check_verify_args(
        children, tokens, target_logits, draft_probs, uniforms, max_depth, temperature, top_k, top_p
    )
    batch, num_nodes, vocab = target_logits.shape
    device = target_logits.device
    accept_len = torch.empty(batch, dtype=torch.long, device=device)
    next_token = torch.empty(batch, dtype=torch.long, device=device)
    path = torch.empty(batch, max_depth, dtype=torch.long, device=device)
    if batch == 0:
        return TreePath(accept_len, next_token, path)
    greedy = temperature == 0
    if greedy:  # never read: any tensor with the right strides stands in
        draft_probs, uniforms = target_logits, target_logits[:, 0]
    tokens, target_logits, draft_probs, uniforms = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (tokens, target_logits, draft_probs, uniforms)
    )
    block_vocab = min(blocks.vocab, triton.next_power_of_2(vocab))
    block_rows = _block_rows(blocks, batch, block_vocab, device)
    if block_rows * block_vocab * SEARCH_DIGITS.value > MAX_TILE:
        raise ValueError(
            f"VerifyBlocks(rows={block_rows}) with vocab tiles of {block_vocab}: the threshold search's "
            f"[rows, {SEARCH_DIGITS.value}, vocab] tile would exceed Triton's {MAX_TILE} elements"
        )
    max_children = children.shape[2]
    _tree_verify_kernel[(triton.cdiv(batch, block_rows),)](
        children, tokens, target_logits, draft_probs, uniforms,
        accept_len, next_token, path,
        batch, num_nodes, vocab, max_depth, max_children,
        float(temperature) if not greedy else 1.0, top_k, float(top_p),
        *children.stride(), tokens.stride(0),
        target_logits.stride(0), target_logits.stride(1), draft_probs.stride(0), draft_probs.stride(1),
        uniforms.stride(0), path.stride(0),
        GREEDY=greedy, TOP_K=not greedy and 0 < top_k < vocab, TOP_P=not greedy and top_p < 1,
        BLOCK_B=block_rows, BLOCK_V=block_vocab,
        BLOCK_C=triton.next_power_of_2(max(max_children, 1)), BLOCK_D=triton.next_power_of_2(max(max_depth, 1)),
        num_warps=blocks.num_warps,
    )  # fmt: skip
    return TreePath(accept_len, next_token, path)
