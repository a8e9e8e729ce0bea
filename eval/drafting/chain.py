"""Chain drafting with an EAGLE head: one candidate per position, the policy (eval/policies.py)
decides each round how many to draft and how many of them to verify. With a confidence head
every draft gets its c_k: policies stop on it, and each round records it (eval/calibration.py)."""

import time
from dataclasses import dataclass

import torch

from eval.drafting.base import DecodeState, Proposal, draft_distribution
from eval.drafting.eagle import EagleDrafter, EagleRunner
from eval.plain_decoder import GREEDY, PlainDecoder
from eval.policies import DraftLengthPolicy, DraftStep
from eval.verify import SamplingParams, sample
from heads.confidence import ConfidenceHead


@dataclass(frozen=True)
class ChainDrafting:
    """One candidate per position; the policy decides the length each round."""

    policy: DraftLengthPolicy

    @property
    def max_depth(self) -> int:
        return self.policy.max_draft_len

    @property
    def verify_room(self) -> int:
        """Target cache slots a round may write past the committed tokens."""
        return self.policy.max_draft_len + 1

    @property
    def draft_room(self) -> int:
        """Drafter cache slots a round may write past the committed tokens."""
        return self.policy.max_draft_len + 1

    @property
    def needs_confidence(self) -> bool:
        return self.policy.needs_confidence

    def describe(self) -> dict:
        return {"drafter": "chain"} | self.policy.describe()

    def build(
        self, drafter: EagleDrafter, plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "ChainStrategy":
        eagle = EagleRunner(drafter, plain, confidence, max_len, self.draft_room, self.max_depth + 1)
        return ChainStrategy(self, eagle)


@dataclass
class DraftedChain:
    drafts: list[torch.Tensor]  # [1] target ids
    draft_probs: list[torch.Tensor | None]  # [1, draft_V] processed draft distributions (None: greedy)
    steps: list[DraftStep]
    confidence_logits: list[torch.Tensor]  # [1] per draft, with a confidence head


class ChainStrategy:
    def __init__(self, setting: ChainDrafting, eagle: EagleRunner):
        self.setting, self.eagle, self.policy = setting, eagle, setting.policy
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.max_drafted = setting.max_depth
        self.layer_ids = eagle.layer_ids
        self.features = eagle.features
        self._round: tuple[list[DraftStep], int] = ([], 0)  # this round's steps and verified count

    def start_request(self, tokens: torch.Tensor) -> None:
        self.policy.start_request()

    def draft(
        self, state: DecodeState, max_drafts: int, sampling: SamplingParams, generator, keep_going
    ) -> DraftedChain:
        """Catch up, then draft up to max_drafts tokens while keep_going(steps) says so."""
        chain = DraftedChain([], [], [], [])
        if max_drafts == 0:
            return chain
        hidden, logits = self.eagle.catch_up(state)
        position = state.committed - 1  # RoPE position (and slot) of the next draft step
        while True:
            probs, log_probs = draft_distribution(logits, sampling)
            draft_id = log_probs.argmax(dim=-1) if probs is None else sample(probs, generator)
            token = self.eagle.draft_token_ids[draft_id]
            # The token the step that made `hidden` consumed: the root for the first draft.
            consumed = chain.drafts[-1] if chain.drafts else state.last_token
            confidence = self._confidence(hidden[:, -1], consumed, len(chain.steps), chain.confidence_logits)
            chain.drafts.append(token)
            chain.draft_probs.append(probs)
            token_prob = log_probs.gather(-1, draft_id.unsqueeze(-1)).exp()[:, 0]
            chain.steps.append(DraftStep(token, token_prob, hidden[:, -1], confidence))
            if len(chain.steps) == max_drafts or not keep_going(chain.steps):
                return chain
            hidden, logits = self.eagle.chain_step(hidden, token, position)
            position += 1

    def _confidence(
        self, hidden: torch.Tensor, consumed: torch.Tensor, position: int, logits_out: list[torch.Tensor]
    ) -> torch.Tensor | None:
        """Calibrated c of one draft ([1]; None without a confidence head) made from hidden [1, H]
        at 0-based draft position `position`; its raw logit is appended to logits_out."""
        logits = self.eagle.confidence_logits(hidden, consumed)
        if logits is None:
            return None
        logits_out.append(logits)
        return self.eagle.confidence.probability(logits, position)

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        max_drafts = (
            min(self.policy.max_draft_len, left - 1) if self.policy.start_round(state.committed) else 0
        )
        chain = self.draft(state, max_drafts, sampling, generator, self.policy.should_continue)
        verified = self.policy.verify_count(chain.steps)
        self._round = (chain.steps, verified)
        return chain_proposal(state, chain, verified, self.eagle)

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        steps, verified = self._round
        self.policy.end_round(steps, verified, accepted)

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        start = time.perf_counter()
        self.draft(state, drafts, GREEDY, None, keep_going=lambda steps: True)
        return time.perf_counter() - start


def chain_proposal(state: DecodeState, chain: DraftedChain, verified: int, eagle: EagleRunner) -> Proposal:
    """The first `verified` drafts of a chain, as the target verifies them."""
    drafts, draft_probs = chain.drafts[:verified], chain.draft_probs[:verified]
    tokens = torch.stack(drafts, dim=1) if drafts else state.pending_ids.new_zeros(1, 0)  # [1, v]
    probs = None
    if drafts and draft_probs[0] is not None:
        probs = eagle.to_target_vocab(torch.stack(draft_probs, dim=1))  # [1, v, V]
    logits = chain.confidence_logits[:verified]
    return Proposal(
        tokens, probs, confidence_logits=torch.cat(logits) if logits else None, drafted=len(chain.drafts)
    )
