"""Hybrid drafting: each round, the n-gram draft where the text's last tokens occurred before
(prompt lookup, eval/drafting/ngram.py: free to make and, where it matches, often long), the
EAGLE head's chain otherwise (its policy decides that round's length, as in chain drafting).

Under the expected-gain policy the n-gram draft is priced too: its drafts' survival is what
this target has made of earlier matches of the same n (NgramSurvival), and it proposes the
prefix whose survival pays for its verification at the round's context, or, where none does,
leaves the round to the head. Its rounds count in the policy's running rate.

The head's drafter keeps up through n-gram rounds without running: their committed positions
stay pending and the head's next catch-up consumes them in one forward. Both kinds of round are
verified by the same exact rules, so greedy and sampled output stay the target's.
"""

import time
from dataclasses import dataclass

import torch

from eval.drafting.base import DecodeState, Proposal
from eval.drafting.chain import ChainDrafting, ChainStrategy
from eval.drafting.eagle import EagleDrafter
from eval.drafting.ngram import NgramDrafting, NgramStrategy
from eval.plain_decoder import GREEDY, PlainDecoder
from eval.policies import ExpectedGain
from eval.verify import SamplingParams
from heads.confidence import ConfidenceHead


@dataclass(frozen=True)
class HybridDrafting:
    chain: ChainDrafting
    ngram: NgramDrafting = NgramDrafting()

    @property
    def max_depth(self) -> int:
        return max(self.chain.max_depth, self.ngram.max_depth)

    @property
    def verify_room(self) -> int:
        return max(self.chain.verify_room, self.ngram.verify_room)

    @property
    def needs_confidence(self) -> bool:
        return self.chain.needs_confidence

    def describe(self) -> dict:
        return {"drafter": "hybrid (n-gram where the text matches, else the head's chain)"} | {
            "head": self.chain.describe(),
            "ngram": self.ngram.describe(),
        }

    def build(
        self, drafter: EagleDrafter, plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "HybridStrategy":
        return HybridStrategy(
            self, self.chain.build(drafter, plain, confidence, max_len), NgramStrategy(self.ngram, plain)
        )


class HybridStrategy:
    def __init__(self, setting: HybridDrafting, head: ChainStrategy, ngram: NgramStrategy):
        self.setting, self.head, self.ngram = setting, head, ngram
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.max_drafted = head.max_drafted  # an n-gram round drafts nothing (its lookup is ~free)
        self.layer_ids = head.layer_ids
        self.features = head.features
        self._head_round = False
        # Under expected gain the head's policy prices the n-gram drafts too.
        self.priced = head.policy if isinstance(head.policy, ExpectedGain) else None
        self.rounds = {"ngram": 0, "head": 0}  # rounds drafted by each, over the strategy's life

    def start_request(self, tokens: torch.Tensor) -> None:
        self.head.start_request(tokens)
        self.ngram.start_request(tokens)

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        keep = None
        if self.priced is not None:
            self.priced.price_at(state.committed)
            keep = self.priced.best_prefix
        proposal = self.ngram.lookup(left, sampling, keep)
        self._head_round = proposal is None
        self.rounds["head" if self._head_round else "ngram"] += 1
        return self.head.propose(state, left, sampling, generator) if proposal is None else proposal

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        if self._head_round:
            self.head.end_round(proposal, accepted, new_tokens)
        elif self.priced is not None:
            self.priced.count_round(accepted + 1, self.priced.verify_cost(proposal.num_drafts))
        self.ngram.end_round(proposal, accepted, new_tokens)

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        """A head round's cost, its failed lookup included (an n-gram round costs only the lookup)."""
        start = time.perf_counter()
        self.ngram.lookup(self.max_depth + 1, GREEDY)
        return time.perf_counter() - start + self.head.draft_cost(state, drafts)
