"""EAGLE-2's dynamic draft tree with an EAGLE head: each depth expands the best nodes (by
cumulative draft log-prob, or by confidence survival) into top_k children each, and the best
`budget` nodes are verified as one tree."""

import time
from dataclasses import dataclass

import torch

from eval.drafting.base import MAX_TREE_NODES, DecodeState, Proposal, draft_distribution, no_drafts
from eval.drafting.eagle import EagleDrafter, EagleRunner
from eval.plain_decoder import GREEDY, PlainDecoder
from eval.policies import MAX_DRAFT_LEN, child_log_survival
from eval.tree import TreeLayout, prune_to_budget, select_children, subtree_parents, tree_layout
from eval.verify import SamplingParams
from heads.confidence import ConfidenceHead


@dataclass(frozen=True)
class TreeDrafting:
    """EAGLE-2 dynamic tree: each depth expands the top_k best nodes by cumulative draft
    log-prob into top_k children each; greedy keeps the best `budget` nodes overall.

    Sampling keeps the first `budget` nodes in construction order instead: dropping a
    child because of its own draft probability would bias the output (verification is
    exact only when each node's children are a prefix of a without-replacement draw).

    by_confidence (needs the decoder's confidence head): expand and keep the nodes of highest
    survival (eval/policies.py `child_log_survival`) instead of draft log-prob, greedy and
    sampling alike: in sampling its scores depend on sibling ranks only, so pruning by them
    keeps every node's children a prefix of their draw.
    """

    depth: int = 5
    top_k: int = 8
    budget: int = 60
    by_confidence: bool = False

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def verify_room(self) -> int:
        return self.budget + 1

    @property
    def draft_room(self) -> int:
        return self.top_k * (self.depth - 1) + 1

    @property
    def needs_confidence(self) -> bool:
        return self.by_confidence

    def describe(self) -> dict:
        return {"drafter": "tree", "depth": self.depth, "top_k": self.top_k, "budget": self.budget} | {
            "by_confidence": self.by_confidence
        }

    def build(
        self, drafter: EagleDrafter, plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "TreeStrategy":
        eagle = EagleRunner(
            drafter, plain, confidence, max_len, self.draft_room, max(self.draft_room, self.max_depth + 1)
        )
        if self.top_k > eagle.draft_vocab:
            raise ValueError(f"tree top_k={self.top_k} exceeds the draft vocabulary of {eagle.draft_vocab}")
        return TreeStrategy(self, eagle)

    def __post_init__(self):
        if not 1 <= self.depth <= MAX_DRAFT_LEN:
            raise ValueError(f"tree depth={self.depth}: must be in [1, {MAX_DRAFT_LEN}]")
        if not 1 <= self.top_k <= MAX_DRAFT_LEN:
            raise ValueError(f"tree top_k={self.top_k}: must be in [1, {MAX_DRAFT_LEN}]")
        capacity = self.top_k + (self.depth - 1) * self.top_k**2
        if not 1 <= self.budget <= min(capacity, MAX_TREE_NODES):
            raise ValueError(
                f"tree budget={self.budget}: must be in [1, {min(capacity, MAX_TREE_NODES)}] "
                f"(depth {self.depth} and top_k {self.top_k} build at most {capacity} nodes)"
            )


class TreeStrategy:
    def __init__(self, setting: TreeDrafting, eagle: EagleRunner):
        self.setting, self.eagle = setting, eagle
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.max_drafted = 0  # a tree is priced by its full round only
        self.layer_ids = eagle.layer_ids
        self.features = eagle.features

    def start_request(self, tokens: torch.Tensor) -> None:
        pass

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        depth = min(self.setting.depth, left - 1)
        if depth == 0:
            return no_drafts(state)
        hidden, logits = self.eagle.catch_up(state)
        layout, tokens, node_probs = self._draft_tree(state, hidden, logits, depth, sampling, generator)
        return Proposal(tokens, node_probs, layout)

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        pass

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        start = time.perf_counter()
        self.propose(state, self.setting.depth + 1, GREEDY, None)
        return time.perf_counter() - start

    def _draft_tree(
        self,
        state: DecodeState,
        root_hidden: torch.Tensor,  # [1, 1, H]
        root_logits: torch.Tensor,  # [1, draft_V]
        depth: int,
        sampling: SamplingParams,
        generator,
    ) -> tuple[TreeLayout, torch.Tensor, torch.Tensor | None]:
        """EAGLE-2 dynamic tree -> (layout, tokens [N] target ids, node draft probs [N, V] or None).

        Candidates are numbered 1.. in construction order (depth by depth; within a depth by
        expanded parent, best first, then sibling order); 0 is the root. Expanded nodes get
        drafter slots base + (level - 1) * top_k + j, and attend to the prefix, their expanded
        ancestors and themselves.
        """
        top_k, sampled = self.setting.top_k, not sampling.greedy
        base = state.committed - 1  # the catch-up filled the drafter cache up to base - 1
        tree_slots = top_k * (depth - 1)
        root_probs, root_log_probs = draft_distribution(root_logits, sampling)
        tokens, log_probs = select_children(root_log_probs, top_k, sampled, generator)  # [1, k] each
        scores = self._child_scores(
            log_probs.new_zeros(1), log_probs, root_hidden[0], state.last_token, 0, sampled
        )
        cand_tokens, cand_scores = [tokens[0]], [scores[0]]
        cand_parents = [torch.zeros(top_k, dtype=torch.long, device=self.eagle.device)]
        expanded_probs = [(torch.zeros(1, dtype=torch.long, device=self.eagle.device), root_probs)]
        front_hidden = root_hidden[0].expand(top_k, -1)  # [n_front, H] hidden feeding each candidate
        front_ancestors = torch.zeros(top_k, tree_slots, dtype=torch.bool, device=self.eagle.device)
        first_index = 1  # number of the first candidate of the current depth
        for level in range(1, depth):
            front_scores = cand_scores[-1]
            expand = front_scores.topk(min(top_k, front_scores.numel())).indices  # [n_exp], best first
            n_exp = expand.numel()
            own_slots = (level - 1) * top_k + torch.arange(n_exp, device=self.eagle.device)
            ancestors = front_ancestors[expand]
            ancestors[torch.arange(n_exp, device=self.eagle.device), own_slots] = True
            mask = torch.zeros(1, 1, n_exp, self.eagle.cache_len, dtype=torch.bool, device=self.eagle.device)
            mask[..., :base] = True
            mask[0, 0, :, base : base + tree_slots] = ancestors
            positions = torch.full((1, n_exp), base + level - 1, device=self.eagle.device)
            parent_tokens = self.eagle.draft_token_ids[cand_tokens[-1][expand]]  # [n_exp] target ids
            hidden, logits = self.eagle.step(
                front_hidden[expand].unsqueeze(0),
                parent_tokens.unsqueeze(0),
                positions,
                base + own_slots,
                mask,
            )
            probs, log_probs = draft_distribution(logits[0], sampling)  # [n_exp, draft_V]
            child_tokens, child_log_probs = select_children(log_probs, top_k, sampled, generator)
            expanded = first_index + expand
            expanded_probs.append((expanded, probs))
            first_index += front_scores.numel()
            cand_tokens.append(child_tokens.flatten())
            child_scores = self._child_scores(
                front_scores[expand], child_log_probs, hidden[0], parent_tokens, level, sampled
            )
            cand_scores.append(child_scores.flatten())
            cand_parents.append(expanded.repeat_interleave(top_k))
            front_hidden = hidden[0].repeat_interleave(top_k, dim=0)
            front_ancestors = ancestors.repeat_interleave(top_k, dim=0)

        all_scores = torch.cat(cand_scores)  # [M]
        budget = min(self.setting.budget, all_scores.numel())
        if sampled and not self.setting.by_confidence:
            keep = torch.arange(1, budget + 1, device=self.eagle.device)
        else:
            keep = prune_to_budget(all_scores, budget) + 1
        root_parent = torch.full((1,), -1, dtype=torch.long, device=self.eagle.device)
        parents = subtree_parents(torch.cat([root_parent, *cand_parents]), keep)
        layout = tree_layout(parents, max_depth=depth, max_children=top_k)
        draft_ids = torch.cat(cand_tokens)[keep - 1]
        tokens = torch.cat([state.last_token, self.eagle.draft_token_ids[draft_ids]])
        if not sampled:
            return layout, tokens, None
        node_probs = root_probs.new_zeros(all_scores.numel() + 1, root_probs.shape[-1])
        for nodes, probs in expanded_probs:
            node_probs[nodes] = probs
        kept_nodes = torch.cat([torch.zeros_like(keep[:1]), keep])
        return layout, tokens, self.eagle.to_target_vocab(node_probs[kept_nodes])

    def _child_scores(
        self,
        parent_scores: torch.Tensor,  # [n] cumulative scores of the expanded nodes
        child_log_probs: torch.Tensor,  # [n, k] draft log-probs of their children, in sibling order
        hidden: torch.Tensor,  # [n, H] the states the children's distributions came from
        consumed: torch.Tensor,  # [n] the expanded nodes' tokens (target ids)
        depth: int,  # 0-based depth of the children
        sampled: bool,
    ) -> torch.Tensor:
        """Children's cumulative scores [n, k]: draft log-prob (EAGLE-2) or log survival."""
        if not self.setting.by_confidence:
            return parent_scores.unsqueeze(1) + child_log_probs
        confidence = self.eagle.confidence.probability(
            self.eagle.confidence_logits(hidden, consumed), depth
        )  # [n]
        return parent_scores.unsqueeze(1) + child_log_survival(confidence, child_log_probs, sampled)
