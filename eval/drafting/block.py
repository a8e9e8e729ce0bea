"""Block drafting: a block drafter (heads/dflash.py) drafts the whole chain in ONE forward.

Each round the positions committed last round enter the drafter's cache as context (keys and
values only), and the anchor (the last committed token) with block_size - 1 mask slots goes
through its layers once; the policy picks how many of the first slots are verified as a chain. The slots do
not depend on each other's tokens, so sampled drafts are drawn independently from each slot's
distribution, which is exactly the distribution chain verification needs (eval/verify.py).
"""

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from eval.drafting.base import DecodeState, Proposal, draft_distribution, no_drafts
from eval.plain_decoder import GREEDY, PlainDecoder
from eval.policies import DraftLengthPolicy, DraftStep
from eval.verify import SamplingParams, sample
from heads.confidence import ConfidenceHead
from heads.kv_cache import KVCache
from heads.packed_linear import module_linears, packed_forwards


class BlockDrafter(Protocol):
    """What the decoder needs from a block drafter (heads/dflash.py)."""

    target_layer_ids: list[int]
    draft_token_ids: torch.Tensor  # [draft_V] target id of each draft id
    block_size: int

    def project_features(
        self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor
    ) -> torch.Tensor: ...

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> list[KVCache]: ...

    def draft_block(
        self, context: torch.Tensor, anchor_id: torch.Tensor, anchor_position: int, cache: list[KVCache]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> states [B, block_size, H] of the anchor and slots, logits [B, block_size - 1, draft_V]
        of the slots after the anchor."""
        ...


@dataclass(frozen=True)
class BlockDrafting:
    """The block drafter's slots, verified as a chain: the policy decides each round how many
    (static: always max_draft_len, at most block_size - 1; draft_prob: the prefix whose chain
    probability stays above its threshold). Drafting costs one forward whatever it decides."""

    policy: DraftLengthPolicy

    @property
    def max_depth(self) -> int:
        return self.policy.max_draft_len

    @property
    def verify_room(self) -> int:
        return self.policy.max_draft_len + 1

    @property
    def needs_confidence(self) -> bool:
        return self.policy.needs_confidence

    def describe(self) -> dict:
        return {"drafter": "block (one forward per round)"} | self.policy.describe()

    def build(
        self, drafter: BlockDrafter, plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "BlockStrategy":
        if drafter is None or not hasattr(drafter, "draft_block"):
            raise ValueError(
                f"block drafting needs a block drafter (heads/dflash.py), got {type(drafter).__name__}"
            )
        if confidence is not None:
            raise ValueError("block drafting does not use a confidence head: leave confidence=None")
        if self.max_depth > drafter.block_size - 1:
            raise ValueError(
                f"block drafting verifies up to {self.max_depth} drafts: the drafter's block holds "
                f"{drafter.block_size - 1}"
            )
        return BlockStrategy(self, drafter, plain, max_len)


class BlockStrategy:
    def __init__(self, setting: BlockDrafting, drafter: BlockDrafter, plain: PlainDecoder, max_len: int):
        self.setting, self.drafter, self.plain, self.policy = setting, drafter, plain, setting.policy
        self.linears = module_linears(drafter)
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.max_drafted = setting.max_depth  # one forward drafts them all: every count costs the same
        self.layer_ids = list(drafter.target_layer_ids)
        self.draft_token_ids = drafter.draft_token_ids.to(plain.device)
        self.cache = drafter.new_cache(1, max_len + drafter.block_size, plain.device, plain.target.dtype)
        self._round: tuple[list[DraftStep], int] = ([], 0)  # this round's steps and verified count

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return self.drafter.project_features(hidden_states, final_hidden)

    def start_request(self, tokens: torch.Tensor) -> None:
        self.policy.start_request()

    def draft(
        self, state: DecodeState, count: int, sampling: SamplingParams, generator
    ) -> tuple[list[DraftStep], torch.Tensor | None]:
        """The new context and the block through the drafter -> the first `count` slots' drafts
        and, when sampling, their distributions over the target vocabulary [count, V]."""
        with packed_forwards(self.linears):
            states, logits = self.drafter.draft_block(
                state.pending_features, state.last_token, state.committed - 1, self.cache
            )
        state.drop_pending()
        probs, log_probs = draft_distribution(logits[0, :count], sampling)  # [count, draft_V]
        draft_ids = log_probs.argmax(dim=-1) if probs is None else sample(probs, generator)
        tokens = self.draft_token_ids[draft_ids]  # [count]
        token_probs = log_probs.gather(-1, draft_ids[:, None]).exp()  # [count, 1]
        steps = [DraftStep(tokens[j : j + 1], token_probs[j], states[:, 1 + j]) for j in range(count)]
        if probs is None:
            return steps, None
        return steps, probs.new_zeros(count, self.plain.vocab_size).index_copy_(
            1, self.draft_token_ids, probs
        )

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        count = min(self.max_depth, left - 1)
        if count == 0 or not self.policy.start_round(state.committed):
            self._round = ([], 0)
            return no_drafts(state)  # the context waits in `state` for the next drafting round
        steps, probs = self.draft(state, count, sampling, generator)
        drafted = next((k for k in range(1, count) if not self.policy.should_continue(steps[:k])), count)
        verified = self.policy.verify_count(steps[:drafted])
        self._round = (steps[:drafted], verified)
        if verified == 0:
            return no_drafts(state, drafted=count)
        tokens = torch.cat([step.token for step in steps[:verified]]).unsqueeze(0)  # [1, verified]
        return Proposal(tokens, None if probs is None else probs[:verified].unsqueeze(0), drafted=count)

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        steps, verified = self._round
        if steps:
            self.policy.end_round(steps, verified, accepted)

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        start = time.perf_counter()
        self.draft(state, self.max_depth, GREEDY, None)
        return time.perf_counter() - start
