"""The built-in speculative decoder: a target, a drafting strategy, static KV caches, batch size 1.

One round:
  1. the strategy proposes drafts (eval/drafting/: an EAGLE chain or tree, Medusa's static
     tree, a block drafter's block, n-gram lookup, or the hybrid of a head and n-grams), catching its drafter up on
     the positions committed last round first;
  2. one target forward over [last committed token, drafts]: a causal mask for a chain,
     the tree mask with depths as positions for a tree;
  3. verification (eval/verify.py), then ONE device read per round: the accept length and
     the new tokens (control flow needs them; everything else stays on the device);
  4. commit without recomputation: a chain's accepted K/V are already in place and the next
     round writes after them; a tree's accepted path is moved into place, every layer at
     once, by the "kv_compact" kernel op (kernels/registry.py: Triton on CUDA, the torch
     reference elsewhere); the target features of the accepted positions wait for the
     drafter's next catch-up.

Invariant: `committed` tokens (prompt + generated); the target cache holds the first
committed - 1 of them; the last one is the root of the next verification.
Batch size is 1: acceptance lengths differ per row, so a batch would need ragged commits;
serving engines do that, this evaluator measures per-request behaviour.
Counters follow SPEC.md section 3 (see eval/metrics.py for what EOS does to them).
"""

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from eval.drafting.base import DecodeState, DraftingStrategy, Proposal
from eval.drafting.block import BlockDrafter, BlockDrafting
from eval.drafting.chain import ChainDrafting
from eval.drafting.eagle import EagleDrafter
from eval.drafting.eagle_tree import TreeDrafting
from eval.drafting.hybrid import HybridDrafting
from eval.drafting.medusa_tree import MedusaDrafter, MedusaTreeDrafting
from eval.drafting.ngram import NgramDrafting
from eval.metrics import SpecCounters
from eval.plain_decoder import GREEDY, ConfidenceRecord, Generation, PlainDecoder
from eval.tree import causal_mask, tree_attention_mask
from eval.verify import (
    SamplingParams,
    process_logits,
    verify_chain_block,
    verify_chain_greedy,
    verify_chain_sampling,
    verify_tree,
)
from heads.confidence import ConfidenceHead
from heads.target import TargetStep
from kernels.registry import kernel

Drafting = ChainDrafting | TreeDrafting | MedusaTreeDrafting | NgramDrafting | HybridDrafting | BlockDrafting
COST_CONTEXTS = (128, 256, 512, 1024)  # context lengths alpha and beta are measured at


def _cut_at_eos(new_tokens: list[int], accepted: int, eos: frozenset[int]) -> tuple[list[int], int]:
    """Drop what follows an EOS; return the kept tokens and how many accepted drafts they hold."""
    for index, token in enumerate(new_tokens):
        if token in eos:
            new_tokens = new_tokens[: index + 1]
            break
    return new_tokens, min(accepted, len(new_tokens))


class SpeculativeDecoder:
    def __init__(
        self,
        target_model: PreTrainedModel,
        drafter: EagleDrafter | MedusaDrafter | BlockDrafter | None,
        drafting: Drafting,
        max_len: int,
        eos_token_id: int | Sequence[int] | None = None,
        kv_bucket: int = 128,
        confidence: ConfidenceHead | None = None,
        cuda_graphs: bool = False,
        verification: str = "token",
        linears: str = "auto",
    ):
        """drafting picks the drafter kind: Chain/Tree/HybridDrafting for EAGLE heads,
        MedusaTreeDrafting for Medusa heads, BlockDrafting for block drafters (heads/dflash.py),
        NgramDrafting for none (drafter=None). Caches are
        allocated here, once. verification: how sampled chains are judged, "token" (Leviathan et
        al.) or "block" (Sun et al.: never fewer accepted drafts in expectation); greedy
        decoding and trees are unaffected.
        confidence: the drafter's confidence head (on the target's device), for the policies
        and trees that need one; with it every chain round records its drafts' confidences.
        cuda_graphs: on CUDA, replay the target's decode and verify forwards and the drafter's
        steps as CUDA graphs (see PlainDecoder). linears: the target's Linear path (PlainDecoder;
        the plain loop of generate_plain is this decoder's, so the two always share it)."""
        if not isinstance(drafting, Drafting):
            raise ValueError(
                f"drafting={drafting!r}: expected one of {[kind.__name__ for kind in Drafting.__args__]}"
            )
        if drafting.needs_confidence and confidence is None:
            raise ValueError(
                f"drafting={drafting!r} ranks drafts by confidence: pass the decoder confidence=<ConfidenceHead>"
            )
        rules = {"token": verify_chain_sampling, "block": verify_chain_block}
        if verification not in rules:
            raise ValueError(f"verification={verification!r}: choose one of {sorted(rules)}")
        self._sampled_chain_rule = rules[verification]
        self.drafting, self.drafter, self.confidence = drafting, drafter, confidence
        self.plain = PlainDecoder(
            target_model, max_len, eos_token_id, kv_bucket, drafting.verify_room, cuda_graphs, linears
        )
        self.device = self.plain.device
        self.strategy: DraftingStrategy = drafting.build(drafter, self.plain, confidence, max_len)
        self.num_positions = self.strategy.max_depth

    @torch.no_grad()
    def generate_plain(
        self,
        prompt_ids: torch.Tensor | Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = GREEDY,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """The baseline: plain decoding with this decoder's target code and caches."""
        return self.plain.generate(prompt_ids, max_new_tokens, sampling, generator)

    def _prefill(self, prompt: torch.Tensor, sampling: SamplingParams, generator) -> DecodeState:
        """The prompt [1, P] through the target -> the state before the first round."""
        out = self.plain.forward(prompt, 0, layer_ids=self.strategy.layer_ids, num_logits=1)
        first = self.plain.choose(out.logits[:, -1], sampling, generator)  # [1]
        self.strategy.start_request(torch.cat([prompt[0], first]))
        return DecodeState(
            committed=prompt.shape[1] + 1,
            last_token=first,
            pending_ids=torch.cat([prompt[:, 1:], first.unsqueeze(0)], dim=1),
            pending_features=self.strategy.features(out.hidden_states, out.final_hidden),
        )

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor | Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = GREEDY,
        generator: torch.Generator | None = None,
    ) -> Generation:
        prompt = self.plain.check_request(prompt_ids, max_new_tokens)
        counters = SpecCounters(self.num_positions, self.device)
        state = self._prefill(prompt, sampling, generator)
        tokens = [int(state.last_token)]
        confidence: list[ConfidenceRecord] = []
        while len(tokens) < max_new_tokens and tokens[-1] not in self.plain.eos:
            proposal = self.strategy.propose(state, max_new_tokens - len(tokens), sampling, generator)
            verify = self._verify_chain if proposal.layout is None else self._verify_tree
            new_tokens, accepted, proposed_positions = verify(state, proposal, sampling, generator)
            self.strategy.end_round(proposal, accepted, new_tokens)
            if proposal.confidence_logits is not None:
                confidence.append(ConfidenceRecord(proposal.confidence_logits, accepted))
            new_tokens, kept_accepted = _cut_at_eos(new_tokens, accepted, self.plain.eos)
            counters.record_round(
                proposal.num_drafts, kept_accepted, len(new_tokens), proposed_positions, proposal.drafted
            )
            tokens += new_tokens
        return Generation(tokens, counters.finish(), tokens[-1] in self.plain.eos, confidence)

    def _verify_chain(
        self, state: DecodeState, proposal: Proposal, sampling: SamplingParams, generator
    ) -> tuple[list[int], int, int]:
        """-> (the round's new tokens, accepted drafts, proposed positions)."""
        draft_tokens = proposal.tokens  # [1, k]
        num_drafts = draft_tokens.shape[1]
        root = state.last_token.unsqueeze(0)  # [1, 1]
        out = self.plain.forward(
            torch.cat([root, draft_tokens], dim=1), state.committed - 1, layer_ids=self.strategy.layer_ids
        )
        spots = torch.arange(num_drafts + 1, device=self.device)
        if num_drafts == 0:  # a plain step: the target's own pick, made as the plain loop makes it
            new_tokens = self.plain.choose(out.logits[:, -1], sampling, generator)  # [1]
            self._commit(state, out, spots, new_tokens)
            return new_tokens.tolist(), 0, 0  # the round's device read
        if sampling.greedy:
            verdict = verify_chain_greedy(draft_tokens, out.logits)
        else:
            verdict = self._sampled_chain_rule(
                draft_tokens, proposal.draft_probs, process_logits(out.logits, sampling), generator
            )
        padded = torch.nn.functional.pad(draft_tokens[0], (0, 1))
        new_tokens = torch.where(spots < verdict.accept_len, padded, verdict.next_token)  # [k + 1]
        accepted, *new_host = torch.cat([verdict.accept_len, new_tokens]).tolist()  # the round's device read
        self._commit(state, out, spots[: accepted + 1], new_tokens[: accepted + 1])
        return new_host[: accepted + 1], accepted, num_drafts

    def _verify_tree(
        self, state: DecodeState, proposal: Proposal, sampling: SamplingParams, generator
    ) -> tuple[list[int], int, torch.Tensor]:
        """-> (the round's new tokens, accepted drafts, the depths proposed [positions] bool)."""
        layout, tokens = proposal.layout, proposal.tokens  # tokens [N] target ids, root first
        start = state.committed - 1
        num_nodes = layout.num_nodes
        mask = tree_attention_mask(layout, start, self.plain.kv_len(start + num_nodes))
        tree = (start + layout.depths, mask)
        out = self.plain.forward(tokens.unsqueeze(0), start, tree, layer_ids=self.strategy.layer_ids)
        draft_probs = None if proposal.draft_probs is None else proposal.draft_probs.unsqueeze(0)
        verdict = verify_tree(layout, tokens.unsqueeze(0), out.logits, draft_probs, sampling, generator)
        path = verdict.path[0]  # [D] accepted node per depth, -1 after
        spots = torch.arange(layout.max_depth + 1, device=self.device)
        path_tokens = torch.nn.functional.pad(tokens[path.clamp_min(0)], (0, 1))  # [D + 1]
        new_tokens = torch.where(spots < verdict.accept_len, path_tokens, verdict.next_token)
        accepted, *new_host = torch.cat([verdict.accept_len, new_tokens]).tolist()  # the round's device read
        if accepted:
            # Move the accepted path's K/V from its tree slots to the sequence slots after the root,
            # every layer in one call: path nodes ascend and node index >= depth, so each source
            # slot lies at or after its destination (what the kernel needs for in-place moves).
            caches = [tensor for layer_cache in self.plain.cache for tensor in (layer_cache.k, layer_cache.v)]
            dst_starts = torch.full((1,), start + 1, device=self.device)
            kernel("kv_compact", self.device)(caches, start + verdict.path, verdict.accept_len, dst_starts)
        path_nodes = torch.cat([path.new_zeros(1), path[:accepted]])
        self._commit(state, out, path_nodes, new_tokens[: accepted + 1])
        depths_proposed = torch.zeros(self.num_positions, dtype=torch.bool, device=self.device)
        depths_proposed[layout.depths[1:] - 1] = True
        return new_host[: accepted + 1], accepted, depths_proposed

    def _commit(
        self, state: DecodeState, out: TargetStep, path_nodes: torch.Tensor, new_tokens: torch.Tensor
    ):
        """Record the accepted positions path_nodes [a + 1] of a verification forward (root first)
        and the tokens they were followed by, new_tokens [a + 1]."""
        features = self.strategy.features(
            [hidden[:, path_nodes] for hidden in out.hidden_states], out.final_hidden[:, path_nodes]
        )
        state.pending_features = torch.cat([state.pending_features, features], dim=1)
        state.pending_ids = torch.cat([state.pending_ids, new_tokens.unsqueeze(0)], dim=1)
        state.committed += new_tokens.numel()
        state.last_token = new_tokens[-1:]

    @torch.no_grad()
    def measure_costs(self, contexts: Sequence[int] = COST_CONTEXTS, reps: int = 8) -> dict:
        """What a round costs on this machine, per context-length bucket (SPEC.md section 3):
        alpha = one full round of drafting (catch-up of two committed positions, every draft
        step, confidence head, n-gram lookup: the strategy times itself) over one plain target
        step; verify_costs[V] = a chain verification of the root and V drafts over one step
        (V = 0..K; for trees, one entry: the whole tree); draft_costs[D] = a round that drafts D
        tokens over one step (chains; D = 0..max_drafted, 0 costing nothing, the last = alpha; a
        block drafter's every count = alpha):
        with the rounds' draft counts they price the rounds as drafted (eval/report.py); beta =
        the deepest verification minus one step, over one step. Each ratio is the median over
        `reps` reps, each rep timing every forward length and drafting round back to back and
        dividing by its own one-token step, so a slow spell of the machine cannot bend a ratio.
        Contexts that do not fit the decoder's max_len are left out (when none fits: the longest
        that does)."""
        room = self.strategy.verify_room
        fitting = [context for context in contexts if context + room + 2 <= self.plain.max_len]
        if not fitting:
            fitting = [self.plain.max_len - room - 2]
            if fitting[0] < 1:
                raise ValueError(
                    f"max_len={self.plain.max_len} leaves no context to time a round of {room} tokens"
                )
        return {str(context): self._costs_at(context, reps) for context in fitting}

    def _costs_at(self, context: int, reps: int) -> dict:
        plain = self.plain
        prompt = torch.randint(0, plain.vocab_size, (1, context), device=self.device)
        base = self._prefill(prompt, GREEDY, None)
        self.strategy.draft_cost(replace(base), self.strategy.max_drafted)  # the prompt's catch-up, untimed
        catch_up = 2  # positions a round typically commits: a catch-up of that many
        tail = replace(
            base,
            pending_ids=base.pending_ids[:, -catch_up:],
            pending_features=base.pending_features[:, -catch_up:],
        )

        room = self.strategy.verify_room
        chain = not isinstance(self.drafting, TreeDrafting | MedusaTreeDrafting)

        def timed_forward(tokens: int) -> float:
            # A tree verifies through the target's tree path (in reduced precision on a CPU its rows
            # are reordered, heads.blocks.attended_first): timed so, over a chain-shaped tree.
            tree = None
            if not chain and tokens > 1:
                mask = causal_mask(context, tokens, plain.kv_len(context + tokens), self.device)
                tree = (plain.slots[context : context + tokens], mask)
            start = time.perf_counter()
            plain.forward(prompt[:, -tokens:], context, tree)
            return time.perf_counter() - start

        lengths = list(range(1, room + 1)) if chain else sorted({1, room})
        full = self.strategy.max_drafted  # a full round (strategies that cannot count ignore it)
        # A block drafter's one forward costs the same whatever the count: its full round prices all.
        counted = chain and not isinstance(self.drafting, BlockDrafting)
        shorter = range(1, full) if counted else ()

        def one_rep() -> dict:
            """Seconds of every forward length and of every drafting round, back to back."""
            rep = {tokens: timed_forward(tokens) for tokens in lengths}
            rep |= {("draft", drafts): self.strategy.draft_cost(replace(tail), drafts) for drafts in shorter}
            return rep | {"draft": self.strategy.draft_cost(replace(tail), full)}

        one_rep()  # warm-up
        reps_timed = [one_rep() for _ in range(reps)]

        def ratio(key) -> float:
            """Median over reps of key's time over the same rep's one-token step: a slow spell of
            the machine slows both sides of a ratio, not one block of timings."""
            return statistics.median(rep[key] / rep[1] for rep in reps_timed)

        step = statistics.median(rep[1] for rep in reps_timed)
        costs = {
            "context_tokens": context,
            "target_step_ms": 1000 * step,
            "verify_ms": 1000 * step * ratio(room),
            "verify_tokens": room,
            "draft_round_ms": 1000 * step * ratio("draft"),
            "alpha": ratio("draft"),
            "beta": ratio(room) - 1,
        }
        costs["break_even_acceptance_length"] = 1 + costs["alpha"] + costs["beta"]
        if chain:
            costs["verify_costs"] = [ratio(tokens) for tokens in lengths]
            shorter_costs = [
                ratio(("draft", drafts)) if counted else costs["alpha"] for drafts in range(1, full)
            ]
            costs["draft_costs"] = [0.0, *shorter_costs, *([costs["alpha"]] if full else [])]
        return costs
