"""What a drafting strategy is to the decoder, and the request state it drafts from.

The decoder core (eval/decoder.py) runs one loop: prefill -> `propose` (the strategy drafts)
-> the target verifies -> commit -> `end_round` -> counters. A strategy owns everything
drafting needs (a drafter and its cache, a draft-length policy, an n-gram index) and times
its own drafting (`draft_cost`), so cost measurement never reaches into its parts.

Each drafting SETTING (ChainDrafting, TreeDrafting, ...) is a frozen dataclass resolved once;
`setting.build(...)` makes the strategy that runs it. Everything that reports a setting (cost
measurement, calibration, the report, export) reads the same object.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from eval.tree import TreeLayout
from eval.verify import SamplingParams, process_logits

MAX_TREE_NODES = 1024  # a larger verification forward costs more than any acceptance gain


@dataclass
class DecodeState:
    committed: int  # prompt + generated tokens; the last one is not in the target cache yet
    last_token: torch.Tensor  # [1] that last token: the root of the next verification
    pending_ids: torch.Tensor  # [1, m] committed tokens the drafter has not consumed
    # [1, m, F] what the strategy keeps of the target's hidden states at the positions before them
    pending_features: torch.Tensor

    def drop_pending(self) -> None:
        """The drafter will not read what is pending (drafting that needs no catch-up)."""
        self.pending_ids = self.pending_ids[:, :0]
        self.pending_features = self.pending_features[:, :0]


@dataclass
class Proposal:
    """A round's drafts, as the target verifies them."""

    tokens: torch.Tensor  # chain: [1, k] drafts (target ids); tree: [N] target ids, the root first
    # Sampling only (None when greedy), over the target vocabulary: chain [1, k, V], the draft
    # distribution of each draft; tree [N, V], the one each node's children were drawn from.
    draft_probs: torch.Tensor | None = None
    layout: TreeLayout | None = None  # a tree's structure; None for a chain
    confidence_logits: torch.Tensor | None = None  # [k] chain drafts' uncalibrated confidence logits
    # Draft tokens a drafter computed this round, verified or not (0 for an n-gram lookup): the
    # index of its drafting cost in the measured `draft_costs`, which price the rounds as drafted.
    drafted: int = 0

    @property
    def num_drafts(self) -> int:
        return self.tokens.shape[1] if self.layout is None else self.layout.num_nodes - 1


def draft_distribution(
    logits: torch.Tensor, sampling: SamplingParams
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Draft logits [n, V'] -> (processed probs, or None when greedy; log-probs), after the same
    logits processing as the target's (SPEC.md section 2)."""
    if sampling.greedy:
        return None, logits.float().log_softmax(dim=-1)
    probs = process_logits(logits, sampling)
    return probs, probs.log()


def no_drafts(state: DecodeState, drafted: int = 0) -> Proposal:
    """An empty chain: the round is a plain target step (after `drafted` drafts nobody verifies)."""
    return Proposal(tokens=state.pending_ids.new_zeros(1, 0), drafted=drafted)


class DraftingStrategy(Protocol):
    max_depth: int  # deepest draft position a round can propose (the counters' positions)
    # Most drafts a round's drafter computes; draft_cost prices 1..max_drafted (0: it prices
    # none, an n-gram lookup; trees price only their full round).
    max_drafted: int
    verify_room: int  # target cache slots a round may write past the committed tokens
    layer_ids: list[int]  # target hidden states the drafter reads (docs/ARCHITECTURE.md ids)

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        """Target hidden states of committed positions ([1, S, H_t] each) -> what the drafter keeps [1, S, F]."""
        ...

    def start_request(self, tokens: torch.Tensor) -> None:
        """tokens [P + 1]: the prompt and the first generated token."""
        ...

    def propose(
        self, state: DecodeState, left: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """The round's drafts; `left` tokens remain to generate (a round emits at most k + 1)."""
        ...

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        """What verification made of the proposal (accepted drafts; the committed tokens)."""
        ...

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        """Seconds a round of drafting `drafts` tokens takes from `state` (timed once; the caller
        repeats on copies of the state and takes the median). A strategy whose drafting costs the
        same whatever the count (a block drafter's one forward, an n-gram lookup, a tree) times
        its full round."""
        ...
