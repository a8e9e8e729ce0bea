"""When to stop drafting a chain: the draft-length policy interface and two policies.

The decoder calls `should_continue` after each drafted token with everything drafted
so far in this round; it never drafts more than `max_draft_len` (nor more than the tokens
left to generate). A policy that looks at values (not just the count) must read the
device once per draft step: that is the price of a dynamic draft length.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

MAX_DRAFT_LEN = 64  # longer chains are never accepted whole; a larger K is a config error


@dataclass
class DraftStep:
    token: torch.Tensor  # [B] drafted token (target vocabulary id)
    token_prob: torch.Tensor  # [B] its draft probability (after logits processing; greedy: softmax)
    hidden: torch.Tensor  # [B, H] drafter hidden state the distribution came from


class DraftLengthPolicy(Protocol):
    max_draft_len: int

    def should_continue(self, steps: Sequence[DraftStep]) -> bool: ...


def check_draft_len(max_draft_len: int) -> None:
    if not 1 <= max_draft_len <= MAX_DRAFT_LEN:
        raise ValueError(f"draft length K={max_draft_len}: must be in [1, {MAX_DRAFT_LEN}]")


@dataclass
class StaticDraftLength:
    """Always K tokens (no device read)."""

    max_draft_len: int

    def __post_init__(self):
        check_draft_len(self.max_draft_len)

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        return len(steps) < self.max_draft_len


@dataclass
class DraftProbabilityThreshold:
    """EAGLE-2's signal: keep drafting while the chain's draft probability (the product of the
    drafted tokens' probabilities, an estimate of its acceptance) stays above `threshold`."""

    max_draft_len: int
    threshold: float

    def __post_init__(self):
        check_draft_len(self.max_draft_len)
        if not 0 <= self.threshold < 1:
            raise ValueError(f"draft policy threshold={self.threshold}: must be in [0, 1)")

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        if len(steps) >= self.max_draft_len:
            return False
        chain_prob = torch.stack([step.token_prob for step in steps]).prod(dim=0)  # [B]
        return bool((chain_prob >= self.threshold).all())
