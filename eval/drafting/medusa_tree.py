"""Medusa's static candidate tree: k heads on the target's last final hidden state, head i
drafting the token i + 2 ahead; the tree's rank paths pick which of each head's top tokens
are verified together (eval/tree.py `static_tree`)."""

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from eval.drafting.base import MAX_TREE_NODES, DecodeState, Proposal, draft_distribution, no_drafts
from eval.plain_decoder import GREEDY, PlainDecoder
from eval.tree import DEFAULT_MEDUSA_PATHS, StaticTree, select_children, static_tree, tree_layout
from eval.verify import SamplingParams
from heads.confidence import ConfidenceHead
from heads.packed_linear import module_linears, packed_forwards


class MedusaDrafter(Protocol):
    def logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """final_hidden [B, S, H] -> logits [heads, B, S, V]; head i predicts the token i + 2 ahead."""
        ...


@dataclass(frozen=True)
class MedusaTreeDrafting:
    """Medusa's static candidate tree, as rank paths (eval/tree.py `static_tree`)."""

    paths: tuple[tuple[int, ...], ...] = DEFAULT_MEDUSA_PATHS

    def __post_init__(self):
        if len(self.paths) > MAX_TREE_NODES:
            raise ValueError(f"medusa tree has {len(self.paths)} nodes; at most {MAX_TREE_NODES}")
        static_tree(self.paths)

    @property
    def tree(self) -> StaticTree:
        return static_tree(self.paths)

    @property
    def max_depth(self) -> int:
        return self.tree.max_depth

    @property
    def verify_room(self) -> int:
        return len(self.paths) + 1

    needs_confidence = False

    def describe(self) -> dict:
        return {"drafter": "medusa static tree", "nodes": len(self.paths), "depth": self.max_depth}

    def build(
        self, drafter: "MedusaDrafter", plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "MedusaStrategy":
        if confidence is not None:
            raise ValueError("the static Medusa tree does not use a confidence head: leave confidence=None")
        if drafter is None or not hasattr(drafter, "logits"):
            raise ValueError(f"Medusa drafting needs a Medusa head, got drafter={type(drafter).__name__}")
        return MedusaStrategy(self, drafter, plain)


class MedusaStrategy:
    layer_ids: list[int] = []  # Medusa reads the target's final hidden state only

    def __init__(self, setting: MedusaTreeDrafting, drafter: MedusaDrafter, plain: PlainDecoder):
        self.setting, self.drafter, self.plain = setting, drafter, plain
        self.linears = module_linears(drafter)
        self.tree: StaticTree = setting.tree
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.max_drafted = 0  # a tree is priced by its full round only

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden

    def start_request(self, tokens: torch.Tensor) -> None:
        pass

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        pass

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        start = time.perf_counter()
        self.propose(state, self.max_depth + 1, GREEDY, None)
        return time.perf_counter() - start

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        tree = self.tree
        depth = min(tree.max_depth, left - 1)
        if depth == 0:
            return no_drafts(state)
        num_nodes = sum(1 for node_depth in tree.depths if node_depth <= depth)  # nodes are depth-sorted
        last_hidden = state.pending_features[:, -1:]  # target final hidden before the root
        state.drop_pending()
        with packed_forwards(self.linears):
            head_logits = self.drafter.logits(last_hidden)[:, 0, -1]  # [heads, V]
        if head_logits.shape[0] < depth:
            raise ValueError(f"medusa tree is {depth} deep but the drafter has {head_logits.shape[0]} heads")
        probs, log_probs = draft_distribution(head_logits[:depth], sampling)  # [depth, V]
        ranks_needed = max(tree.ranks[1:num_nodes]) + 1
        candidates, _ = select_children(log_probs, ranks_needed, not sampling.greedy, generator)
        depths = torch.tensor(tree.depths[:num_nodes], device=self.plain.device)
        ranks = torch.tensor(tree.ranks[:num_nodes], device=self.plain.device)
        tokens = candidates[(depths - 1).clamp_min(0), ranks]
        tokens[0] = state.last_token[0]
        parents = torch.tensor(tree.parents[:num_nodes], device=self.plain.device)
        layout = tree_layout(parents, max_depth=depth, max_children=tree.max_children)
        # Every node at depth d draws its children from head d's distribution.
        node_probs = None if probs is None else probs[depths.clamp_max(depth - 1)]
        return Proposal(tokens, node_probs, layout)
