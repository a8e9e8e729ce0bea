"""Acceptance rules of speculative decoding (SPEC.md section 2): the torch reference.

Pure functions, tensors in and tensors out, batched over a leading dim B: the decoder
calls them with B = 1, the statistical tests with B = 100k independent draws, and a
Triton kernel will use them as its reference. Randomness comes only from an explicit
`torch.Generator`, so a run is reproducible.

Trees are given as a `TreeLayout` (eval/tree.py): node 0 is the root (the last committed
token), and the distributions stored at node u are the ones for u's children.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from eval.tree import TreeLayout

# residual(target_probs [B, V], draft_probs [B, V]) -> unnormalised distribution [B, V]
ResidualRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingParams:
    """Logits processing applied identically to the target and the draft (HF order)."""

    temperature: float = 0.0  # 0 = greedy (top_k / top_p are then irrelevant)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"sampling.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p={self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k={self.top_k}: must be >= 0 (0 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Verdict:
    """Outcome of one verification round, per batch row."""

    accept_len: torch.Tensor  # [B] accepted draft tokens
    next_token: torch.Tensor  # [B] the target-chosen token emitted after them (correction or bonus)
    path: torch.Tensor | None = None  # [B, max_depth] tree nodes accepted at depth 1.., -1 after (trees)


def process_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (as HF's warpers): logits [..., V] -> probs [..., V] fp32."""
    if sampling.greedy:
        raise ValueError("process_logits is for sampling; greedy decoding uses the argmax")
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth_largest = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if sampling.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Drop a token once the tokens above it already cover top_p (the top token always stays).
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from probs [..., V] (exponential race: argmax p/E, E ~ Exp(1); no sync)."""
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(dim=-1)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """max(0, p - q): the only rule after a rejection that keeps the target distribution (SPEC 2)."""
    return (target_probs - draft_probs).clamp_min(0)


def _normalise(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """weights [B, V] / their sum; rows summing to 0 (float round-off only) take fallback [B, V]."""
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny), fallback)


def _pick(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs [B, ..., V] at tokens [B, ...] -> [B, ...]."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def verify_chain_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Accept while draft == target argmax; emit the target argmax after the last accepted token.

    draft_tokens [B, K], target_logits [B, K + 1, V] (position i scores draft token i + 1).
    """
    num_drafts = draft_tokens.shape[1]
    target_choice = target_logits.argmax(dim=-1)  # [B, K + 1]
    matches = draft_tokens == target_choice[:, :num_drafts]
    accept_len = matches.long().cumprod(dim=-1).sum(dim=-1)
    next_token = target_choice.gather(1, accept_len.unsqueeze(1)).squeeze(1)
    return Verdict(accept_len, next_token)


def verify_chain_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    residual: ResidualRule = residual_distribution,
) -> Verdict:
    """Leviathan et al. Alg. 1: accept x_i w.p. min(1, p/q); residual on rejection; bonus at K + 1.

    draft_tokens [B, K] drawn from draft_probs [B, K, V]; target_probs [B, K + 1, V]. Both
    distributions are after the same logits processing. `residual` is injectable only so a
    test can show that a wrong rule is caught.
    """
    batch, num_drafts, vocab = draft_probs.shape
    draft_token_probs = _pick(draft_probs, draft_tokens)  # [B, K]
    target_token_probs = _pick(target_probs[:, :num_drafts], draft_tokens)  # [B, K]
    coins = torch.rand(draft_token_probs.shape, generator=generator, device=draft_probs.device)
    accepted = coins * draft_token_probs < target_token_probs  # u < p / q without dividing
    accept_len = accepted.long().cumprod(dim=-1).sum(dim=-1)  # [B]

    stop_row = accept_len.view(batch, 1, 1).expand(batch, 1, vocab)
    target_at_stop = target_probs.gather(1, stop_row).squeeze(1)  # [B, V]
    # A zero draft row at K + 1 makes the stop position uniform: the bonus has nothing to subtract.
    padded_draft = torch.nn.functional.pad(draft_probs, (0, 0, 0, 1))  # [B, K + 1, V]
    draft_at_stop = padded_draft.gather(1, stop_row).squeeze(1)
    rejected = (accept_len < num_drafts).unsqueeze(1)
    corrected = _normalise(residual(target_at_stop, draft_at_stop), fallback=target_at_stop)
    next_probs = torch.where(rejected, corrected, target_at_stop)
    return Verdict(accept_len, sample(next_probs, generator))


def verify_tree_greedy(layout: TreeLayout, tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Follow the child equal to the target argmax, as deep as it goes (siblings must be distinct).

    tokens [B, N] (node 0 = root, its token unused), target_logits [B, N, V] (at each node,
    the scores of its children).
    """
    batch = tokens.shape[0]
    target_choice = target_logits.argmax(dim=-1)  # [B, N]
    parent_choice = target_choice[:, layout.parents.clamp_min(0)]  # [B, N] argmax at each node's parent
    matches = tokens == parent_choice
    matches[:, 0] = True
    # A node is on the accepted path when it and all its ancestors match.
    on_path = ~(layout.ancestors.unsqueeze(0) & ~matches.unsqueeze(1)).any(dim=-1)  # [B, N]
    accept_len = on_path.long().sum(dim=-1) - 1
    depth_of_path = torch.where(on_path, layout.depths, -1)  # [B, N]
    deepest = depth_of_path.argmax(dim=-1)  # [B]
    next_token = target_choice.gather(1, deepest.unsqueeze(1)).squeeze(1)
    depth_slots = torch.arange(1, layout.max_depth + 1, device=tokens.device)
    at_depth = depth_of_path.unsqueeze(1) == depth_slots.view(1, -1, 1)  # [B, D, N]
    path = torch.where(at_depth.any(dim=-1), at_depth.long().argmax(dim=-1), -1)  # [B, D]
    return Verdict(accept_len.view(batch), next_token, path)


def verify_tree_sampling(
    layout: TreeLayout,
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    residual: ResidualRule = residual_distribution,
) -> Verdict:
    """Recursive rejection sampling without replacement (SpecInfer; EAGLE's evaluate_posterior).

    At an accepted node, for each child x in sibling order: accept w.p. min(1, p(x)/q(x));
    on rejection p <- norm(max(p - q, 0)), q(x) <- 0 and q is renormalised. All children
    rejected: emit from the final p. Exact when each node's children were drawn from its q
    without replacement, in sibling order (eval/tree.py `select_children` with sampling).
    tokens [B, N]; draft_probs, target_probs [B, N, V] (at each node, the distributions
    of its children). Children whose q is 0 (the draft could not have drawn them) are skipped.
    """
    batch = target_probs.shape[0]
    rows = torch.arange(batch, device=tokens.device)
    current = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # accepted node
    descending = torch.ones(batch, dtype=torch.bool, device=tokens.device)
    path = torch.full((batch, layout.max_depth), -1, dtype=torch.long, device=tokens.device)
    target_now = target_probs[:, 0]  # [B, V]
    draft_now = draft_probs[:, 0]
    for depth in range(layout.max_depth):
        moved = torch.zeros_like(descending)
        for sibling in range(layout.max_children):
            child = layout.children[current, sibling]  # [B], -1 where there is none
            token = tokens[rows, child.clamp_min(0)]
            draft_token_prob = _pick(draft_now, token)
            trying = descending & ~moved & (child >= 0) & (draft_token_prob > 0)
            coins = torch.rand(batch, generator=generator, device=tokens.device)
            accepted = trying & (coins * draft_token_prob < _pick(target_now, token))
            rejected = (trying & ~accepted).unsqueeze(1)
            target_residual = _normalise(residual(target_now, draft_now), fallback=target_now)
            draft_untried = draft_now.scatter(1, token.unsqueeze(1), 0.0)
            draft_untried = _normalise(draft_untried, fallback=draft_untried)
            target_now = torch.where(rejected, target_residual, target_now)
            draft_now = torch.where(rejected, draft_untried, draft_now)
            moved |= accepted
            current = torch.where(accepted, child, current)
        path[:, depth] = torch.where(moved, current, -1)
        target_now = torch.where(moved.unsqueeze(1), target_probs[rows, current], target_now)
        draft_now = torch.where(moved.unsqueeze(1), draft_probs[rows, current], draft_now)
        descending &= moved
    accept_len = (path >= 0).long().sum(dim=-1)
    return Verdict(accept_len, sample(target_now, generator), path)
