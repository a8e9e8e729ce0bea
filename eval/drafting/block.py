"""Block drafting: a block drafter (heads/dflash.py) drafts the whole chain in ONE forward.

Each round the positions committed last round enter the drafter's cache as context (keys and
values only), and the anchor (the last committed token) with block_size - 1 mask slots goes
through its layers once; the first `draft_length` slots are verified as a chain. The slots do
not depend on each other's tokens, so sampled drafts are drawn independently from each slot's
distribution, which is exactly the distribution chain verification needs (eval/verify.py).
"""

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from eval.drafting.base import DecodeState, Proposal, draft_distribution, no_drafts
from eval.plain_decoder import GREEDY, PlainDecoder
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
    ) -> torch.Tensor:
        """-> logits [B, block_size - 1, draft_V] of the slots after the anchor."""
        ...


@dataclass(frozen=True)
class BlockDrafting:
    """The block drafter's slots 1..draft_length (at most block_size - 1), verified as a chain."""

    draft_length: int

    needs_confidence = False

    def __post_init__(self):
        if self.draft_length < 1:
            raise ValueError(f"block draft_length={self.draft_length}: must be >= 1")

    @property
    def max_depth(self) -> int:
        return self.draft_length

    @property
    def verify_room(self) -> int:
        return self.max_depth + 1

    def describe(self) -> dict:
        return {"drafter": "block (one forward per round)", "draft_length": self.draft_length}

    def build(
        self, drafter: BlockDrafter, plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "BlockStrategy":
        if drafter is None or not hasattr(drafter, "draft_block"):
            raise ValueError(
                f"block drafting needs a block drafter (heads/dflash.py), got {type(drafter).__name__}"
            )
        if confidence is not None:
            raise ValueError("block drafting does not use a confidence head: leave confidence=None")
        if self.draft_length > drafter.block_size - 1:
            raise ValueError(
                f"block draft_length={self.draft_length}: the drafter's block holds {drafter.block_size - 1} drafts"
            )
        return BlockStrategy(self, drafter, plain, max_len)


class BlockStrategy:
    def __init__(self, setting: BlockDrafting, drafter: BlockDrafter, plain: PlainDecoder, max_len: int):
        self.setting, self.drafter, self.plain = setting, drafter, plain
        self.linears = module_linears(drafter)
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.layer_ids = list(drafter.target_layer_ids)
        self.draft_token_ids = drafter.draft_token_ids.to(plain.device)
        self.cache = drafter.new_cache(1, max_len + drafter.block_size, plain.device, plain.target.dtype)

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return self.drafter.project_features(hidden_states, final_hidden)

    def start_request(self, tokens: torch.Tensor) -> None:
        pass

    def _draft(self, state: DecodeState, count: int, sampling: SamplingParams, generator) -> Proposal:
        anchor = state.committed - 1
        with packed_forwards(self.linears):
            logits = self.drafter.draft_block(state.pending_features, state.last_token, anchor, self.cache)
        state.drop_pending()
        probs, log_probs = draft_distribution(logits[0, :count], sampling)  # [count, draft_V]
        draft_ids = log_probs.argmax(dim=-1) if probs is None else sample(probs, generator)
        tokens = self.draft_token_ids[draft_ids].unsqueeze(0)  # [1, count]
        if probs is None:
            return Proposal(tokens)
        target_probs = probs.new_zeros(count, self.plain.vocab_size).index_copy_(
            1, self.draft_token_ids, probs
        )
        return Proposal(tokens, target_probs.unsqueeze(0))

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        count = min(self.max_depth, left - 1)
        return self._draft(state, count, sampling, generator) if count > 0 else no_drafts(state)

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        pass

    def draft_cost(self, state: DecodeState) -> float:
        start = time.perf_counter()
        self._draft(state, self.max_depth, GREEDY, None)
        return time.perf_counter() - start
