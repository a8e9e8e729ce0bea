"""Acceptance rules of speculative decoding (SPEC.md section 2).

Pure functions, tensors in and tensors out, batched over a leading dim B: the decoder
calls them with B = 1, the statistical tests with B = 100k independent draws. Chains are
verified here in torch. Trees go through the kernel registry (`verify_tree`: the Triton
kernel on CUDA, the torch reference kernels/tree_verify_reference.py elsewhere), whose
reference holds the tree rules and the logits processing this module builds on.
Randomness comes only from an explicit `torch.Generator`, so a run is reproducible.

Trees are given as a `TreeLayout` (eval/tree.py): node 0 is the root (the last committed
token), and the distributions stored at node u are the ones for u's children.
"""

from dataclasses import dataclass

import torch

from eval.tree import TreeLayout
from kernels.registry import kernel
from kernels.tree_verify_reference import (
    ResidualRule,
    draw_uniforms,
    normalise,
    pick,
    processed_probs,
    rejection_walk,
    residual_distribution,
    sample,
)


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
    return processed_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)


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


def _at_stop(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, accept_len: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target and draft distributions [B, V] at each row's stop position accept_len [B].
    A zero draft row at K + 1 makes the stop after the last draft uniform: the bonus token has
    nothing to subtract."""
    batch, _, vocab = draft_probs.shape
    stop_row = accept_len.view(batch, 1, 1).expand(batch, 1, vocab)
    padded_draft = torch.nn.functional.pad(draft_probs, (0, 0, 0, 1))  # [B, K + 1, V]
    return target_probs.gather(1, stop_row).squeeze(1), padded_draft.gather(1, stop_row).squeeze(1)


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
    num_drafts = draft_probs.shape[1]
    draft_token_probs = pick(draft_probs, draft_tokens)  # [B, K]
    target_token_probs = pick(target_probs[:, :num_drafts], draft_tokens)  # [B, K]
    coins = torch.rand(draft_token_probs.shape, generator=generator, device=draft_probs.device)
    accepted = coins * draft_token_probs < target_token_probs  # u < p / q without dividing
    accept_len = accepted.long().cumprod(dim=-1).sum(dim=-1)  # [B]

    target_at_stop, draft_at_stop = _at_stop(target_probs, draft_probs, accept_len)
    rejected = (accept_len < num_drafts).unsqueeze(1)
    corrected = normalise(residual(target_at_stop, draft_at_stop), fallback=target_at_stop)
    next_probs = torch.where(rejected, corrected, target_at_stop)
    return Verdict(accept_len, sample(next_probs, generator))


def verify_chain_block(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    residual_weight: bool = True,
) -> Verdict:
    """Block verification (Sun et al., ICLR 2025, Algorithm 2; SPEC.md section 2): the chain is
    judged as a whole, so a rejected draft no longer discards the chance that a longer prefix
    would have survived. Never fewer accepted tokens in expectation than `verify_chain_sampling`,
    and the output distribution is exactly the target's.

    p_0 = 1, p_i = min(1, p_{i-1} Mb(X_i) / Ms(X_i)); for i < K, h_i = Z_i / (Z_i + 1 - p_i) with
    Z_i = sum_x max(p_i Mb_{i+1}(x) - Ms_{i+1}(x), 0), h_K = p_K; tau = the largest i >= 1 whose
    coin eta_i <= h_i (0 if none); then emit from norm(max(p_tau Mb_{tau+1} - Ms_{tau+1}, 0)),
    which for tau = K is Mb_{K+1} itself. Shapes as `verify_chain_sampling`. residual_weight
    False drops p_tau from the residual: only so that a test can show a wrong rule is caught.
    """
    batch, num_drafts, _ = draft_probs.shape
    if num_drafts == 0:  # nothing to judge: the target's own token
        return Verdict(draft_tokens.new_zeros(batch), sample(target_probs[:, 0], generator))
    ratio = pick(target_probs[:, :num_drafts], draft_tokens) / pick(draft_probs, draft_tokens)  # [B, K]
    weights = [torch.ones(batch, device=draft_probs.device)]
    for i in range(num_drafts):
        weights.append(torch.minimum(weights[-1] * ratio[:, i], torch.ones_like(ratio[:, i])))
    weight = torch.stack(weights, dim=1)  # [B, K + 1]: p_0 .. p_K
    # Residual mass after i accepted drafts, i = 1 .. K - 1 (position i + 1's distributions).
    leftover = (weight[:, 1:num_drafts, None] * target_probs[:, 1:num_drafts] - draft_probs[:, 1:]).clamp_min(
        0
    )
    mass = leftover.sum(dim=-1)  # [B, K - 1]
    denominator = mass + 1 - weight[:, 1:num_drafts]
    stop_chance = torch.where(denominator > 0, mass / denominator.clamp_min(1e-30), torch.zeros_like(mass))
    stop_chance = torch.cat([stop_chance, weight[:, num_drafts:]], dim=1)  # [B, K]: h_1 .. h_K
    coins = torch.rand(stop_chance.shape, generator=generator, device=draft_probs.device)
    depth = torch.arange(1, num_drafts + 1, device=draft_probs.device).expand(batch, num_drafts)
    accept_len = torch.where(coins <= stop_chance, depth, torch.zeros_like(depth)).amax(dim=1)  # [B]

    target_at_stop, draft_at_stop = _at_stop(target_probs, draft_probs, accept_len)
    scale = (
        weight.gather(1, accept_len.unsqueeze(1))
        if residual_weight
        else torch.ones(batch, 1, device=weight.device)
    )
    next_probs = normalise((scale * target_at_stop - draft_at_stop).clamp_min(0), fallback=target_at_stop)
    return Verdict(accept_len, sample(next_probs, generator))


def verify_tree(
    layout: TreeLayout,
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
) -> Verdict:
    """One tree verification round through the kernel registry (kernels/tree_verify_reference.py
    has the rules): the target's logits are processed by `sampling` inside.

    tokens [B, N] (node 0 = root, its token unused), target_logits [B, N, V] (at each node, the
    scores of its children); draft_probs [B, N, V] processed draft distributions (sampling), or
    None when greedy. The random numbers are drawn here, from generator.
    """
    batch, num_nodes, vocab = target_logits.shape
    uniforms = None
    if not sampling.greedy:
        uniforms = draw_uniforms(batch, num_nodes, vocab, generator, target_logits.device)
    out = kernel("tree_verify", target_logits.device)(
        layout.children.expand(batch, -1, -1),
        tokens,
        target_logits,
        draft_probs,
        uniforms,
        layout.max_depth,
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
    )
    return Verdict(out.accept_len, out.next_token, out.path)


def verify_tree_greedy(layout: TreeLayout, tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Follow the first child equal to the target argmax, as deep as it goes.

    tokens [B, N] (node 0 = root, its token unused), target_logits [B, N, V] (at each node,
    the scores of its children).
    """
    return verify_tree(layout, tokens, target_logits, None, SamplingParams())


def verify_tree_sampling(
    layout: TreeLayout,
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    residual: ResidualRule = residual_distribution,
) -> Verdict:
    """Recursive rejection sampling without replacement (SpecInfer; EAGLE's evaluate_posterior)
    on processed probabilities, in torch (the kernel takes logits: `verify_tree`).

    At an accepted node, for each child x in sibling order: accept w.p. min(1, p(x)/q(x));
    on rejection p <- norm(max(p - q, 0)), q(x) <- 0 and q is renormalised. All children
    rejected: emit from the final p. Exact when each node's children were drawn from its q
    without replacement, in sibling order (eval/tree.py `select_children` with sampling).
    tokens [B, N]; draft_probs, target_probs [B, N, V] (at each node, the distributions
    of its children). Children whose q is 0 (the draft could not have drawn them) are skipped.
    """
    batch, num_nodes, vocab = target_probs.shape
    uniforms = draw_uniforms(batch, num_nodes, vocab, generator, target_probs.device)
    children = layout.children.expand(batch, -1, -1)
    out = rejection_walk(children, tokens, draft_probs, target_probs, uniforms, layout.max_depth, residual)
    return Verdict(out.accept_len, out.next_token, out.path)
