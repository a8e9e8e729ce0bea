"""Torch reference of tree verification (SPEC.md section 2): one round's accepted path, its
length and the target-chosen token after it, batched over requests, greedy or sampled.

Trees come as children tables (kernels/tree_metadata_reference.py builds them from parent
arrays): children[b, u] lists node u's children in the order verification tries them, -1
padded; node 0 is the root (the last committed token) and the distributions stored at node u
are the ones for u's children. A path never goes deeper than max_depth.

Greedy (temperature 0): at the current node, accept the first child whose token is the target
argmax there (argmax ties: the lowest token id); stop when none is; the emitted token is the
target argmax at the last accepted node.

Sampling: recursive rejection sampling without replacement (SpecInfer; EAGLE's
evaluate_posterior). At an accepted node with target p and draft q, for each child x in
sibling order: accept w.p. min(1, p(x)/q(x)); on rejection p <- norm(max(p - q, 0)),
q(x) <- 0 and q is renormalised; children with q(x) = 0 are skipped. If a child is accepted,
descend; if none is, emit a token from the final p. Exact when each node's children were
drawn from its q without replacement, in sibling order. The target distribution is the
target logits after temperature, then top-k, then top-p (Hugging Face's warper order); the
draft probabilities come already processed the same way.

Randomness contract (shared with the Triton kernel, so that both consume the same random
numbers and agree exactly; see `draw_uniforms`): the caller passes uniforms [B, N + V] in
[0, 1). uniforms[b, j] (j < N) is node j's acceptance coin: j is accepted iff
coin * q(x_j) < p(x_j) (each node is tried at most once). uniforms[b, N:] draw the emitted
token by an exponential race: argmax_v w(v) / -log(uniforms[b, N + v]) over the final,
possibly unnormalised, weights w (lowest id on ties). Kernel and reference then agree
exactly except where a decision lies within float round-off of its threshold: a coin, the two
best entries of the race, or a token's mass-above at the top-p cutoff (logits tied exactly at
that cutoff are ordered by the reference's sort, by the kernel as one).

This module imports without Triton; eval/verify.py builds on it.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

# residual(target_probs [B, V], draft_probs [B, V]) -> unnormalised distribution [B, V]
ResidualRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TreePath(NamedTuple):
    accept_len: torch.Tensor  # [B] accepted draft tokens
    next_token: torch.Tensor  # [B] the target-chosen token emitted after them (correction or bonus)
    path: torch.Tensor  # [B, max_depth] accepted node at depth 1.., -1 after


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not temperature >= 0:
        raise ValueError(f"tree_verify: temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k < 0:
        raise ValueError(f"tree_verify: top_k={top_k} must be >= 0 (0 = off)")
    if not 0 < top_p <= 1:
        raise ValueError(f"tree_verify: top_p={top_p} must be in (0, 1] (1 = off)")


def check_verify_args(
    children: torch.Tensor,
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor | None,
    max_depth: int,
    temperature: float,
    top_k: int,
    top_p: float,
) -> None:
    """Shape, dtype and device checks shared by the reference and the kernel (no host sync)."""
    check_sampling(temperature, top_k, top_p)
    if target_logits.dim() != 3 or not target_logits.is_floating_point():
        raise ValueError(
            f"tree_verify: target_logits must be float [B, N, V], got {target_logits.dtype} "
            f"{tuple(target_logits.shape)}"
        )
    batch, num_nodes, vocab = target_logits.shape
    if tokens.shape != (batch, num_nodes) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ValueError(
            f"tree_verify: tokens must be integer [B={batch}, N={num_nodes}], got {tokens.dtype} "
            f"{tuple(tokens.shape)}"
        )
    if (
        children.dim() != 3
        or children.shape[:2] != (batch, num_nodes)
        or children.is_floating_point()
        or children.dtype == torch.bool
    ):
        raise ValueError(
            f"tree_verify: children must be integer [B={batch}, N={num_nodes}, C], got {children.dtype} "
            f"{tuple(children.shape)}"
        )
    if max_depth < 0:
        raise ValueError(f"tree_verify: max_depth={max_depth} must be >= 0")
    sampled = {"draft_probs": draft_probs, "uniforms": uniforms}
    if temperature == 0:
        given = [name for name, tensor in sampled.items() if tensor is not None]
        if given:
            raise ValueError(f"tree_verify: greedy (temperature 0) takes no {' or '.join(given)}")
    else:
        shapes = {"draft_probs": (batch, num_nodes, vocab), "uniforms": (batch, num_nodes + vocab)}
        for name, tensor in sampled.items():
            if tensor is None or tensor.shape != shapes[name] or not tensor.is_floating_point():
                got = "None" if tensor is None else f"{tensor.dtype} {tuple(tensor.shape)}"
                raise ValueError(f"tree_verify: sampling needs float {name} {list(shapes[name])}, got {got}")
    for name, tensor in [("children", children), ("tokens", tokens), *sampled.items()]:
        if tensor is not None and tensor.device != target_logits.device:
            raise ValueError(
                f"tree_verify: {name} is on {tensor.device}, target_logits on {target_logits.device}"
            )


def processed_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Temperature, then top-k, then top-p (as HF's warpers): logits [..., V] -> probs [..., V] fp32."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Drop a token once the tokens strictly above it already cover top_p (the top token
        # always stays). Tied tokens share the mass above their first one, so a tie is kept or
        # dropped whole, whatever order the sort gave it (bf16 logits tie often; the Triton
        # kernel, which never sorts, decides the same way).
        first_of_tie = torch.searchsorted(-sorted_logits, -sorted_logits, side="left")
        drop_sorted = mass_before.gather(-1, first_of_tie) >= top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """max(0, p - q): the only rule after a rejection that keeps the target distribution (SPEC 2)."""
    return (target_probs - draft_probs).clamp_min(0)


def normalise(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """weights [B, V] / their sum; rows summing to 0 (float round-off only) take fallback [B, V]."""
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny), fallback)


def pick(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """probs [B, ..., V] at tokens [B, ...] -> [B, ...]."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def draw_uniforms(
    batch: int,
    num_nodes: int,
    vocab: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The random numbers of one sampled verification round: uniforms [B, N + V] (module docstring)."""
    return torch.rand(batch, num_nodes + vocab, generator=generator, device=device)


def exponentials(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exp(1) noise shaped like `like` (fp32), as -log(u) (race's convention): ~4x faster on a
    CPU than torch's exponential_, which costs 1.4 ms per 49k-token row on one core, a few
    percent of a small target's decode step, paid by every sampled token and draft."""
    return torch.rand(like.shape, generator=generator, device=like.device).log_().neg_()


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from probs [..., V] (exponential race: argmax p/E, E ~ Exp(1); no sync)."""
    return (probs / exponentials(probs, generator)).argmax(dim=-1)


def race(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of weights [B, V] >= 0 (any scale) from uniforms [B, V]: an exponential
    race, argmax w / E with E = -log(u) ~ Exp(1), draws v with probability w(v) / sum(w)."""
    return (weights / -uniforms.log()).argmax(dim=-1)


def greedy_walk(
    children: torch.Tensor, tokens: torch.Tensor, target_logits: torch.Tensor, max_depth: int
) -> TreePath:
    """The greedy rule (module docstring) on children [B, N, C], tokens [B, N], target_logits [B, N, V]."""
    batch = tokens.shape[0]
    rows = torch.arange(batch, device=tokens.device)
    target_choice = target_logits.argmax(dim=-1)  # [B, N]
    current = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    descending = torch.ones(batch, dtype=torch.bool, device=tokens.device)
    path = torch.full((batch, max_depth), -1, dtype=torch.long, device=tokens.device)
    for depth in range(max_depth):
        moved = torch.zeros_like(descending)
        wanted = target_choice[rows, current]  # [B]
        for sibling in range(children.shape[2]):
            child = children[rows, current, sibling].long()  # [B], -1 where there is none
            token = tokens[rows, child.clamp_min(0)]
            accepted = descending & ~moved & (child >= 0) & (token == wanted)
            moved |= accepted
            current = torch.where(accepted, child, current)
        path[:, depth] = torch.where(moved, current, -1)
        descending &= moved
    accept_len = (path >= 0).long().sum(dim=-1)
    return TreePath(accept_len, target_choice[rows, current], path)


def rejection_walk(
    children: torch.Tensor,
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    max_depth: int,
    residual: ResidualRule = residual_distribution,
) -> TreePath:
    """Recursive rejection sampling (module docstring) on processed probabilities.

    children [B, N, C]; tokens [B, N]; draft_probs, target_probs [B, N, V] (at each node, the
    distributions of its children); uniforms [B, N + V]. `residual` is injectable only so a
    test can show that a wrong rule is caught.
    """
    batch, num_nodes = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    current = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # accepted node
    descending = torch.ones(batch, dtype=torch.bool, device=tokens.device)
    path = torch.full((batch, max_depth), -1, dtype=torch.long, device=tokens.device)
    target_now = target_probs[:, 0].float()  # [B, V]
    draft_now = draft_probs[:, 0].float()
    for depth in range(max_depth):
        moved = torch.zeros_like(descending)
        for sibling in range(children.shape[2]):
            child = children[rows, current, sibling].long()  # [B], -1 where there is none
            node = child.clamp_min(0)
            token = tokens[rows, node]
            draft_token_prob = pick(draft_now, token)
            trying = descending & ~moved & (child >= 0) & (draft_token_prob > 0)
            coins = uniforms[rows, node]
            accepted = trying & (coins * draft_token_prob < pick(target_now, token))
            rejected = (trying & ~accepted).unsqueeze(1)
            target_residual = normalise(residual(target_now, draft_now), fallback=target_now)
            draft_untried = draft_now.scatter(1, token.unsqueeze(1), 0.0)
            draft_untried = normalise(draft_untried, fallback=draft_untried)
            target_now = torch.where(rejected, target_residual, target_now)
            draft_now = torch.where(rejected, draft_untried, draft_now)
            moved |= accepted
            current = torch.where(accepted, child, current)
        path[:, depth] = torch.where(moved, current, -1)
        target_now = torch.where(moved.unsqueeze(1), target_probs[rows, current].float(), target_now)
        draft_now = torch.where(moved.unsqueeze(1), draft_probs[rows, current].float(), draft_now)
        descending &= moved
    accept_len = (path >= 0).long().sum(dim=-1)
    return TreePath(accept_len, race(target_now, uniforms[:, num_nodes:]), path)


def tree_verify_reference(
    children: torch.Tensor,
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor | None,
    max_depth: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> TreePath:
    """Verify a batch of draft trees in one call (module docstring).

    children [B, N, C] integer, each node's children in sibling order, -1 padded (a [1, N, C]
    table expanded to B rows works); tokens [B, N] (node 0's unused); target_logits [B, N, V]
    (at each node, the scores of its children); temperature 0 = greedy, with draft_probs and
    uniforms None; otherwise draft_probs [B, N, V] (processed) and uniforms [B, N + V].
    """
    check_verify_args(
        children, tokens, target_logits, draft_probs, uniforms, max_depth, temperature, top_k, top_p
    )
    if temperature == 0:
        return greedy_walk(children, tokens, target_logits, max_depth)
    target_probs = processed_probs(target_logits, temperature, top_k, top_p)
    return rejection_walk(children, tokens, draft_probs, target_probs, uniforms, max_depth)
