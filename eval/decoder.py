"""The built-in speculative decoder: a target plus a drafter, static KV caches, batch size 1.

One round (EAGLE-kind drafter):
  1. catch-up: the positions committed last round go through the drafter with the
     target's own features (EAGLE's shift: the feature of position t with the token at
     t + 1, at RoPE position t), overwriting what drafting wrote there; its last output is
     the first draft distribution. After the prefill this is the whole prompt.
  2. drafting: more single-token steps on the drafter's own hidden state (chain, length
     chosen by a policy), or the expansions of a dynamic tree (EAGLE-2). With a confidence
     head (heads/confidence.py) each draft also gets its c_k: policies stop on it, trees
     rank nodes by survival, and chain rounds record it (eval/calibration.py).
  3. one target forward over [last committed token, drafts]: a causal mask for a chain,
     the tree mask with depths as positions for a tree.
  4. verification (eval/verify.py), then ONE device read per round: the accept length
     and the new tokens (control flow needs them; everything else stays on the device).
  5. commit without recomputation: a chain's accepted K/V are already in place and the
     next round writes after them; a tree's accepted path is moved into place, every
     layer at once, by the "kv_compact" kernel op. The drafter's cache needs nothing:
     step 1 of the next round overwrites its draft-time entries with ones computed from
     the target's features. Tree metadata and verification are kernel ops too
     (kernels/registry.py: Triton on CUDA, the torch references elsewhere).
Medusa drafters draft a static tree from the target's last final hidden state instead;
n-gram drafting (eval/ngram.py) needs no drafter: it drafts from the text itself.

Invariant: `committed` tokens (prompt + generated); the target cache holds the first
committed - 1 of them; the last one is the root of the next verification.
Batch size is 1: acceptance lengths differ per row, so a batch would need ragged
commits; serving engines do that, this evaluator measures per-request behaviour.
Counters follow SPEC.md section 3 (see eval/metrics.py for what EOS does to them).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import PreTrainedModel

from eval.cuda_graphs import GraphedForward
from eval.metrics import DecodeMetrics, SpecCounters
from eval.ngram import NgramIndex
from eval.policies import MAX_DRAFT_LEN, DraftLengthPolicy, DraftStep, child_log_survival
from eval.tree import (
    DEFAULT_MEDUSA_PATHS,
    StaticTree,
    TreeLayout,
    causal_mask,
    prune_to_budget,
    select_children,
    static_tree,
    subtree_parents,
    tree_attention_mask,
    tree_layout,
)
from eval.verify import (
    SamplingParams,
    process_logits,
    sample,
    verify_chain_block,
    verify_chain_greedy,
    verify_chain_sampling,
    verify_tree,
)
from heads.confidence import ConfidenceHead
from heads.kv_cache import KVCache
from heads.target import CachedTarget, TargetStep
from kernels.registry import kernel

MAX_TREE_NODES = 1024  # a larger verification forward costs more than any acceptance gain
GREEDY = SamplingParams()


class EagleDrafter(Protocol):
    """What the decoder needs from an EAGLE-3 / EAGLE-1 head (heads/)."""

    target_layer_ids: list[int]  # target hidden states it reads (docs/ARCHITECTURE.md ids)
    draft_token_ids: torch.Tensor  # [draft_V] target id of each draft id

    def project_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        """Target hidden states ([B, S, H_t] per layer id) + final hidden -> features [B, S, H]."""
        ...

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> list[KVCache]: ...

    def step(
        self,
        features: torch.Tensor,  # [B, S, H] feature of position t
        input_ids: torch.Tensor,  # [B, S] token at t + 1 (target vocabulary)
        positions: torch.Tensor,  # [B, S] RoPE position t
        cache: list[KVCache],
        cache_positions: torch.Tensor,  # [S] slots its K/V are written at
        attn_mask: torch.Tensor,  # [B or 1, 1, S, max_len] bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (hidden [B, S, H], the next feature when drafting on; draft_logits [B, S, draft_V])."""
        ...


class MedusaDrafter(Protocol):
    def logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """final_hidden [B, S, H] -> logits [heads, B, S, V]; head i predicts the token i + 2 ahead."""
        ...


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


@dataclass(frozen=True)
class NgramDrafting:
    """Prompt lookup (eval/ngram.py): no drafter; the tokens that followed the latest earlier
    occurrence of the text's last max_ngram .. min_ngram tokens, up to draft_length of them,
    verified as a chain with one-hot draft distributions (exact for greedy and sampling)."""

    draft_length: int = 8
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        if not 1 <= self.draft_length <= MAX_DRAFT_LEN:
            raise ValueError(f"n-gram draft_length={self.draft_length}: must be in [1, {MAX_DRAFT_LEN}]")
        NgramIndex(self.max_ngram, self.min_ngram)  # checks the sizes

    @property
    def max_depth(self) -> int:
        return self.draft_length

    @property
    def verify_room(self) -> int:
        return self.draft_length + 1


Drafting = ChainDrafting | TreeDrafting | MedusaTreeDrafting | NgramDrafting


def _check_confidence(drafting: Drafting, confidence: ConfidenceHead | None) -> None:
    """Refuse a drafting that needs a confidence head without one, and one given to Medusa."""
    needs = (isinstance(drafting, ChainDrafting) and drafting.policy.needs_confidence) or (
        isinstance(drafting, TreeDrafting) and drafting.by_confidence
    )
    if needs and confidence is None:
        raise ValueError(
            f"drafting={drafting!r} ranks drafts by confidence: pass the decoder confidence=<ConfidenceHead>"
        )
    blind = {MedusaTreeDrafting: "the static Medusa tree", NgramDrafting: "n-gram drafting"}
    if confidence is not None and type(drafting) in blind:
        raise ValueError(f"{blind[type(drafting)]} does not use a confidence head: leave confidence=None")


@dataclass
class ConfidenceRecord:
    """One chain round seen by a confidence head (eval/calibration.py reads these)."""

    logits: torch.Tensor  # [k] uncalibrated confidence logits of the round's drafts, on the device
    accepted: int  # drafts verification accepted (before any EOS cut)


@dataclass
class Generation:
    tokens: list[int]  # new tokens, prompt excluded; ends with EOS when stopped by it
    metrics: DecodeMetrics
    stopped_by_eos: bool
    # With a confidence head: one record per chain round that drafted.
    confidence: list[ConfidenceRecord] = field(default_factory=list)


@dataclass
class _State:
    committed: int  # prompt + generated tokens; the last one is not in the target cache yet
    last_token: torch.Tensor  # [1] that last token: the root of the next verification
    pending_ids: torch.Tensor  # [1, m] committed tokens the drafter has not consumed
    pending_features: torch.Tensor  # [1, m, H] target features of the positions before them
    ngram: NgramIndex | None = None  # n-gram drafting: every committed token, indexed


@dataclass
class _Round:
    new_tokens: list[int]  # accepted drafts + the target's token, before any EOS cut
    accepted: int
    proposed: int
    proposed_positions: int | torch.Tensor  # see SpecCounters.record_round
    confidence_logits: torch.Tensor | None = None  # [k] chain drafts' uncalibrated confidence logits


def _as_prompt(prompt_ids: torch.Tensor | Sequence[int], device: torch.device) -> torch.Tensor:
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(
            f"prompt_ids of shape {tuple(prompt.shape)}: the decoder takes one non-empty prompt "
            "(batch size 1: a list of ids or a [1, P] tensor)"
        )
    return prompt.unsqueeze(0)


def _cut_at_eos(new_tokens: list[int], accepted: int, eos: frozenset[int]) -> tuple[list[int], int]:
    """Drop what follows an EOS; return the kept tokens and how many accepted drafts they hold."""
    for index, token in enumerate(new_tokens):
        if token in eos:
            new_tokens = new_tokens[: index + 1]
            break
    return new_tokens, min(accepted, len(new_tokens))


class PlainDecoder:
    """Plain autoregressive decoding over the cached target forward: the baseline, and the
    target half of the speculative decoder (same forward, same caches, same sampling)."""

    def __init__(
        self,
        target_model: PreTrainedModel,
        max_len: int,
        eos_token_id: int | Sequence[int] | None = None,
        kv_bucket: int = 128,
        cache_room: int = 0,
        cuda_graphs: bool = False,
    ):
        """max_len: prompt + new tokens. eos_token_id: None = the model's generation config.
        kv_bucket: attention reads the cache up to the next multiple of it (fewer shapes,
        less work than the whole cache). cache_room: extra slots for draft tokens.
        cuda_graphs: on a CUDA target, replay forwards of up to cache_room + 1 tokens (decode
        steps, verification) as CUDA graphs (eval/cuda_graphs.py); attention then always
        reads the whole cache, so that one graph serves every position."""
        self.target = CachedTarget(target_model)
        limit = target_model.config.max_position_embeddings
        if not 1 <= max_len <= limit:
            raise ValueError(f"max_len={max_len}: must be in [1, max_position_embeddings={limit}]")
        if kv_bucket < 1:
            raise ValueError(f"kv_bucket={kv_bucket}: must be >= 1")
        if eos_token_id is None:
            eos_token_id = target_model.generation_config.eos_token_id
        if eos_token_id is None:
            eos_token_id = []
        self.eos = frozenset([eos_token_id] if isinstance(eos_token_id, int) else map(int, eos_token_id))
        self.max_len = max_len
        self.device = self.target.device
        self.cache_len = max_len + cache_room
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.kv_bucket = self.cache_len if self.cuda_graphs else kv_bucket
        self.cache = self.target.new_cache(1, self.cache_len)
        self._forward = self._cached_forward
        if self.cuda_graphs:
            self._forward = GraphedForward(self._cached_forward, max_tokens=cache_room + 1)
        self.slots = torch.arange(self.cache_len, device=self.device)
        self.vocab_size = target_model.lm_head.weight.shape[0]

    def kv_len(self, needed: int) -> int:
        return min(self.cache_len, -(-needed // self.kv_bucket) * self.kv_bucket)

    def check_request(self, prompt_ids, max_new_tokens: int) -> torch.Tensor:
        prompt = _as_prompt(prompt_ids, self.device)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
        if prompt.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt of {prompt.shape[1]} tokens + max_new_tokens={max_new_tokens} exceeds the "
                f"decoder's context max_len={self.max_len}"
            )
        return prompt

    def choose(
        self, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The target's own pick from logits [B, V] -> [B]."""
        if sampling.greedy:
            return logits.argmax(dim=-1)
        return sample(process_logits(logits, sampling), generator)

    def forward(
        self,
        input_ids: torch.Tensor,
        start: int,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> TargetStep:
        """input_ids [1, S] written at slots start..: a causal sequence there, or a tree given
        as (positions [S], mask [1, 1, S, L])."""
        length = input_ids.shape[1]
        slots = self.slots[start : start + length]
        if tree is None:
            positions, mask = slots, causal_mask(start, length, self.kv_len(start + length), self.device)
        else:
            positions, mask = tree
        return self._forward(input_ids, positions.unsqueeze(0), slots, mask, **kwargs)

    def _cached_forward(
        self, input_ids, positions, slots, mask, layer_ids: Sequence[int] = (), num_logits: int | None = None
    ) -> TargetStep:
        return self.target.forward(
            input_ids, positions, self.cache, slots, mask, tuple(layer_ids), num_logits
        )

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor | Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = GREEDY,
        generator: torch.Generator | None = None,
    ) -> Generation:
        prompt = self.check_request(prompt_ids, max_new_tokens)
        counters = SpecCounters(0, self.device)
        last = self.choose(self.forward(prompt, 0, num_logits=1).logits[:, -1], sampling, generator)
        tokens = [int(last)]
        committed = prompt.shape[1] + 1
        while len(tokens) < max_new_tokens and tokens[-1] not in self.eos:
            logits = self.forward(last.unsqueeze(0), committed - 1).logits[:, -1]
            last = self.choose(logits, sampling, generator)
            tokens.append(int(last))  # the one device read per token: EOS decides the control flow
            committed += 1
            counters.record_round(0, 0, 1, 0)
        return Generation(tokens, counters.finish(), tokens[-1] in self.eos)


class SpeculativeDecoder:
    def __init__(
        self,
        target_model: PreTrainedModel,
        drafter: EagleDrafter | MedusaDrafter | None,
        drafting: Drafting,
        max_len: int,
        eos_token_id: int | Sequence[int] | None = None,
        kv_bucket: int = 128,
        confidence: ConfidenceHead | None = None,
        cuda_graphs: bool = False,
        verification: str = "token",
    ):
        """drafting picks the drafter kind: Chain/TreeDrafting for EAGLE heads,
        MedusaTreeDrafting for Medusa heads, NgramDrafting for none (drafter=None). Caches are
        allocated here, once. verification: how sampled chains are judged, "token" (Leviathan et
        al.) or "block" (Sun et al.: never fewer accepted drafts in expectation); greedy
        decoding and trees are unaffected.
        confidence: the drafter's confidence head (on the target's device), for the policies
        and trees that need one; with it every chain round records its drafts' confidences.
        cuda_graphs: on CUDA, replay the target's decode and verify forwards and the drafter's
        steps as CUDA graphs (see PlainDecoder)."""
        _check_confidence(drafting, confidence)
        rules = {"token": verify_chain_sampling, "block": verify_chain_block}
        if verification not in rules:
            raise ValueError(f"verification={verification!r}: choose one of {sorted(rules)}")
        self._sampled_chain_rule = rules[verification]
        self.confidence = confidence
        rounds = {
            ChainDrafting: (self._chain_round, self._eagle_features),
            TreeDrafting: (self._tree_round, self._eagle_features),
            MedusaTreeDrafting: (self._medusa_round, self._medusa_features),
            NgramDrafting: (self._ngram_round, self._no_features),
        }
        if type(drafting) not in rounds:
            raise ValueError(f"drafting={drafting!r}: expected one of {[kind.__name__ for kind in rounds]}")
        self._round, self._features = rounds[type(drafting)]
        self.drafter = drafter
        self.drafting = drafting
        self.num_positions = drafting.max_depth
        self.plain = PlainDecoder(
            target_model, max_len, eos_token_id, kv_bucket, drafting.verify_room, cuda_graphs
        )
        self.device = self.plain.device
        self.layer_ids: list[int] = []
        if isinstance(drafting, MedusaTreeDrafting):
            self.static_tree = drafting.tree
        elif isinstance(drafting, NgramDrafting):
            # Drafts are target ids with one-hot draft distributions over the whole vocabulary.
            self.draft_token_ids = torch.arange(self.plain.vocab_size, device=self.device)
        else:
            self._setup_eagle(drafter, drafting, max_len)

    def _setup_eagle(
        self, drafter: EagleDrafter, drafting: ChainDrafting | TreeDrafting, max_len: int
    ) -> None:
        self.layer_ids = list(drafter.target_layer_ids)
        self.draft_token_ids = drafter.draft_token_ids.to(self.device)
        draft_vocab = self.draft_token_ids.numel()
        lowest, highest = self.draft_token_ids.min().item(), self.draft_token_ids.max().item()
        if lowest < 0 or highest >= self.plain.vocab_size:
            raise ValueError(
                f"drafter.draft_token_ids name ids outside the target vocabulary of {self.plain.vocab_size}: "
                "was the head trained for another target?"
            )
        if self.draft_token_ids.unique().numel() != draft_vocab:
            raise ValueError(
                "drafter.draft_token_ids repeats target ids: the draft vocabulary map is corrupt"
            )
        if isinstance(drafting, TreeDrafting) and drafting.top_k > draft_vocab:
            raise ValueError(f"tree top_k={drafting.top_k} exceeds the draft vocabulary of {draft_vocab}")
        self.drafter_cache_len = max_len + drafting.draft_room
        self.drafter_cache = drafter.new_cache(
            1, self.drafter_cache_len, self.device, self.plain.target.dtype
        )
        self._drafter_step = self._eager_drafter_step
        if self.plain.cuda_graphs:
            self._drafter_step = GraphedForward(
                self._eager_drafter_step,
                max_tokens=max(drafting.draft_room, drafting.max_depth + 1),
                token_dim_arg=1,
            )

    def _eager_drafter_step(self, features, input_ids, positions, cache_positions, mask):
        return self.drafter.step(features, input_ids, positions, self.drafter_cache, cache_positions, mask)

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
        if isinstance(self.drafting, ChainDrafting):
            self.drafting.policy.start_request()
        out = self.plain.forward(prompt, 0, layer_ids=self.layer_ids, num_logits=1)
        first = self.plain.choose(out.logits[:, -1], sampling, generator)  # [1]
        state = _State(
            committed=prompt.shape[1] + 1,
            last_token=first,
            pending_ids=torch.cat([prompt[:, 1:], first.unsqueeze(0)], dim=1),
            pending_features=self._features(out.hidden_states, out.final_hidden),
        )
        tokens = [int(first)]
        if isinstance(self.drafting, NgramDrafting):
            state.ngram = NgramIndex(self.drafting.max_ngram, self.drafting.min_ngram)
            state.ngram.extend(prompt[0].tolist() + tokens)
        confidence: list[ConfidenceRecord] = []
        while len(tokens) < max_new_tokens and tokens[-1] not in self.plain.eos:
            result = self._round(state, max_new_tokens - len(tokens), sampling, generator)
            new_tokens, accepted = _cut_at_eos(result.new_tokens, result.accepted, self.plain.eos)
            counters.record_round(result.proposed, accepted, len(new_tokens), result.proposed_positions)
            tokens += new_tokens
            if result.confidence_logits is not None:
                confidence.append(ConfidenceRecord(result.confidence_logits, result.accepted))
        return Generation(tokens, counters.finish(), tokens[-1] in self.plain.eos, confidence)

    # --- features the next round drafts from -------------------------------------------

    def _eagle_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return self.drafter.project_features(hidden_states, final_hidden)

    def _medusa_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden

    def _no_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden[..., :0]  # [1, S, 0]: n-gram drafting reads the tokens only

    def _commit(self, state: _State, out: TargetStep, path_nodes: torch.Tensor, new_tokens: torch.Tensor):
        """Record the accepted positions path_nodes [a + 1] of a verification forward (root first)
        and the tokens they were followed by, new_tokens [a + 1]."""
        features = self._features(
            [hidden[:, path_nodes] for hidden in out.hidden_states], out.final_hidden[:, path_nodes]
        )
        state.pending_features = torch.cat([state.pending_features, features], dim=1)
        state.pending_ids = torch.cat([state.pending_ids, new_tokens.unsqueeze(0)], dim=1)
        state.committed += new_tokens.numel()
        state.last_token = new_tokens[-1:]

    # --- n-gram drafting ---------------------------------------------------------------

    def _ngram_round(self, state: _State, left: int, sampling: SamplingParams, generator) -> _Round:
        state.pending_ids, state.pending_features = state.pending_ids[:, :0], state.pending_features[:, :0]
        drafted = state.ngram.draft(min(self.drafting.draft_length, left - 1))
        draft_tokens = torch.tensor([drafted], dtype=torch.long, device=self.device).view(1, -1)  # [1, k]
        draft_probs = (
            []
            if sampling.greedy
            else list(torch.nn.functional.one_hot(draft_tokens[0], self.plain.vocab_size).float()[:, None])
        )  # k x [1, V]: the draft distribution is certain of each drafted token
        result = self._verify_chain(state, draft_tokens, draft_probs, sampling, generator)
        state.ngram.extend(result.new_tokens)
        return result

    # --- EAGLE drafting -----------------------------------------------------------------

    def _catch_up(self, state: _State) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the pending positions through the drafter -> (last hidden [1, 1, H], logits [1, draft_V])."""
        length = state.pending_ids.shape[1]
        start = state.committed - 1 - length
        slots = self.plain.slots[start : start + length]
        mask = causal_mask(start, length, self.drafter_cache_len, self.device)
        hidden, logits = self._drafter_step(
            state.pending_features, state.pending_ids, slots.unsqueeze(0), slots, mask
        )
        state.pending_ids = state.pending_ids[:, :0]
        state.pending_features = state.pending_features[:, :0]
        return hidden[:, -1:], logits[:, -1]

    def _draft_distribution(
        self, logits: torch.Tensor, sampling: SamplingParams
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Draft logits [n, draft_V] -> (processed probs, or None when greedy; log-probs)."""
        if sampling.greedy:
            return None, logits.float().log_softmax(dim=-1)
        probs = process_logits(logits, sampling)
        return probs, probs.log()

    def _to_target_vocab(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """[..., draft_V] -> [..., V]: target tokens outside the draft vocabulary get probability 0."""
        target_probs = draft_probs.new_zeros(*draft_probs.shape[:-1], self.plain.vocab_size)
        return target_probs.index_copy_(draft_probs.dim() - 1, self.draft_token_ids, draft_probs)

    def _chain_round(self, state: _State, left: int, sampling: SamplingParams, generator) -> _Round:
        policy = self.drafting.policy
        max_drafts = min(policy.max_draft_len, left - 1) if policy.start_round() else 0
        drafts: list[torch.Tensor] = []  # [1] target ids
        draft_probs: list[torch.Tensor] = []  # [1, draft_V]
        steps: list[DraftStep] = []
        confidence_logits: list[torch.Tensor] = []  # [1] per draft, with a confidence head
        if max_drafts > 0:
            hidden, logits = self._catch_up(state)
            position = state.committed - 1  # RoPE position (and slot) of the next draft step
            while True:
                probs, log_probs = self._draft_distribution(logits, sampling)
                draft_id = log_probs.argmax(dim=-1) if probs is None else sample(probs, generator)
                token = self.draft_token_ids[draft_id]
                # The token the step that made `hidden` consumed: the root for the first draft.
                consumed = drafts[-1] if drafts else state.last_token
                confidence = self._draft_confidence(hidden[:, -1], consumed, len(steps), confidence_logits)
                drafts.append(token)
                draft_probs.append(probs)
                token_prob = log_probs.gather(-1, draft_id.unsqueeze(-1)).exp()[:, 0]
                steps.append(DraftStep(token, token_prob, hidden[:, -1], confidence))
                if len(steps) == max_drafts or not policy.should_continue(steps):
                    break
                slot = self.plain.slots[position : position + 1]
                mask = causal_mask(position, 1, self.drafter_cache_len, self.device)
                hidden, logits = self._drafter_step(hidden, token.unsqueeze(0), slot.unsqueeze(0), slot, mask)
                logits = logits[:, -1]
                position += 1
        verified = policy.verify_count(steps)
        drafts, draft_probs = drafts[:verified], draft_probs[:verified]
        confidence_logits = confidence_logits[:verified]
        draft_tokens = torch.stack(drafts, dim=1) if drafts else state.pending_ids.new_zeros(1, 0)  # [1, v]
        result = self._verify_chain(state, draft_tokens, draft_probs, sampling, generator)
        if confidence_logits:
            result.confidence_logits = torch.cat(confidence_logits)
        policy.end_round(steps, verified, result.accepted)
        return result

    def _draft_confidence(
        self,
        hidden: torch.Tensor,  # [1, H] the state the draft's distribution came from
        consumed: torch.Tensor,  # [1] the token that state's step consumed
        position: int,  # 0-based draft position (depth - 1)
        logits_out: list[torch.Tensor],
    ) -> torch.Tensor | None:
        """Calibrated c of one draft ([1]; None without a confidence head); its raw logit is
        appended to logits_out for the round's record."""
        if self.confidence is None:
            return None
        logits = self.confidence(hidden, consumed)  # [1]
        logits_out.append(logits)
        return self.confidence.probability(logits, position)

    def _verify_chain(
        self,
        state: _State,
        draft_tokens: torch.Tensor,  # [1, k]
        draft_probs: list[torch.Tensor],  # k x [1, draft_V] (sampling)
        sampling: SamplingParams,
        generator,
    ) -> _Round:
        num_drafts = draft_tokens.shape[1]
        root = state.last_token.unsqueeze(0)  # [1, 1]
        out = self.plain.forward(
            torch.cat([root, draft_tokens], dim=1), state.committed - 1, layer_ids=self.layer_ids
        )
        if sampling.greedy:
            verdict = verify_chain_greedy(draft_tokens, out.logits)
        else:
            if draft_probs:
                stacked = self._to_target_vocab(torch.stack(draft_probs, dim=1))  # [1, k, V]
            else:
                stacked = out.logits.new_zeros(1, 0, self.plain.vocab_size, dtype=torch.float32)
            verdict = self._sampled_chain_rule(
                draft_tokens, stacked, process_logits(out.logits, sampling), generator
            )
        spots = torch.arange(num_drafts + 1, device=self.device)
        padded = torch.nn.functional.pad(draft_tokens[0], (0, 1))
        new_tokens = torch.where(spots < verdict.accept_len, padded, verdict.next_token)  # [k + 1]
        accepted, *new_host = torch.cat([verdict.accept_len, new_tokens]).tolist()  # the round's device read
        self._commit(state, out, spots[: accepted + 1], new_tokens[: accepted + 1])
        return _Round(new_host[: accepted + 1], accepted, num_drafts, num_drafts)

    def _tree_round(self, state: _State, left: int, sampling: SamplingParams, generator) -> _Round:
        depth = min(self.drafting.depth, left - 1)
        if depth == 0:
            return self._verify_chain(state, state.pending_ids.new_zeros(1, 0), [], sampling, generator)
        hidden, logits = self._catch_up(state)
        layout, tokens, node_probs = self._draft_tree(state, hidden, logits, depth, sampling, generator)
        return self._verify_tree(state, layout, tokens, node_probs, sampling, generator)

    def _draft_tree(
        self,
        state: _State,
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
        top_k, sampled = self.drafting.top_k, not sampling.greedy
        base = state.committed - 1  # the catch-up filled the drafter cache up to base - 1
        tree_slots = top_k * (depth - 1)
        root_probs, root_log_probs = self._draft_distribution(root_logits, sampling)
        tokens, log_probs = select_children(root_log_probs, top_k, sampled, generator)  # [1, k] each
        scores = self._child_scores(
            log_probs.new_zeros(1), log_probs, root_hidden[0], state.last_token, 0, sampled
        )
        cand_tokens, cand_scores = [tokens[0]], [scores[0]]
        cand_parents = [torch.zeros(top_k, dtype=torch.long, device=self.device)]
        expanded_probs = [(torch.zeros(1, dtype=torch.long, device=self.device), root_probs)]
        front_hidden = root_hidden[0].expand(top_k, -1)  # [n_front, H] hidden feeding each candidate
        front_ancestors = torch.zeros(top_k, tree_slots, dtype=torch.bool, device=self.device)
        first_index = 1  # number of the first candidate of the current depth
        for level in range(1, depth):
            front_scores = cand_scores[-1]
            expand = front_scores.topk(min(top_k, front_scores.numel())).indices  # [n_exp], best first
            n_exp = expand.numel()
            own_slots = (level - 1) * top_k + torch.arange(n_exp, device=self.device)
            ancestors = front_ancestors[expand]
            ancestors[torch.arange(n_exp, device=self.device), own_slots] = True
            mask = torch.zeros(1, 1, n_exp, self.drafter_cache_len, dtype=torch.bool, device=self.device)
            mask[..., :base] = True
            mask[0, 0, :, base : base + tree_slots] = ancestors
            positions = torch.full((1, n_exp), base + level - 1, device=self.device)
            parent_tokens = self.draft_token_ids[cand_tokens[-1][expand]]  # [n_exp] target ids
            hidden, logits = self._drafter_step(
                front_hidden[expand].unsqueeze(0),
                parent_tokens.unsqueeze(0),
                positions,
                base + own_slots,
                mask,
            )
            probs, log_probs = self._draft_distribution(logits[0], sampling)  # [n_exp, draft_V]
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
        budget = min(self.drafting.budget, all_scores.numel())
        if sampled and not self.drafting.by_confidence:
            keep = torch.arange(1, budget + 1, device=self.device)
        else:
            keep = prune_to_budget(all_scores, budget) + 1
        root_parent = torch.full((1,), -1, dtype=torch.long, device=self.device)
        parents = subtree_parents(torch.cat([root_parent, *cand_parents]), keep)
        layout = tree_layout(parents, max_depth=depth, max_children=top_k)
        draft_ids = torch.cat(cand_tokens)[keep - 1]
        tokens = torch.cat([state.last_token, self.draft_token_ids[draft_ids]])
        if not sampled:
            return layout, tokens, None
        node_probs = root_probs.new_zeros(all_scores.numel() + 1, root_probs.shape[-1])
        for nodes, probs in expanded_probs:
            node_probs[nodes] = probs
        kept_nodes = torch.cat([torch.zeros_like(keep[:1]), keep])
        return layout, tokens, self._to_target_vocab(node_probs[kept_nodes])

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
        if not self.drafting.by_confidence:
            return parent_scores.unsqueeze(1) + child_log_probs
        confidence = self.confidence.probability(self.confidence(hidden, consumed), depth)  # [n]
        return parent_scores.unsqueeze(1) + child_log_survival(confidence, child_log_probs, sampled)

    # --- tree verification (EAGLE and Medusa) -------------------------------------------

    def _verify_tree(
        self,
        state: _State,
        layout: TreeLayout,
        tokens: torch.Tensor,  # [N] target ids, root first
        node_probs: torch.Tensor | None,  # [N, V] draft distribution of each node's children (sampling)
        sampling: SamplingParams,
        generator,
    ) -> _Round:
        start = state.committed - 1
        num_nodes = layout.num_nodes
        mask = tree_attention_mask(layout, start, self.plain.kv_len(start + num_nodes))
        tree = (start + layout.depths, mask)
        out = self.plain.forward(tokens.unsqueeze(0), start, tree, layer_ids=self.layer_ids)
        draft_probs = None if node_probs is None else node_probs.unsqueeze(0)
        verdict = verify_tree(layout, tokens.unsqueeze(0), out.logits, draft_probs, sampling, generator)
        path = verdict.path[0]  # [D] accepted node per depth, -1 after
        spots = torch.arange(layout.max_depth + 1, device=self.device)
        path_tokens = torch.nn.functional.pad(tokens[path.clamp_min(0)], (0, 1))  # [D + 1]
        new_tokens = torch.where(spots < verdict.accept_len, path_tokens, verdict.next_token)
        accepted, *new_host = torch.cat([verdict.accept_len, new_tokens]).tolist()  # the round's device read
        accepted_nodes = path[:accepted]
        if accepted:
            # Move the accepted path's K/V from its tree slots to the sequence slots after the root,
            # every layer in one call: path nodes ascend and node index >= depth, so each source
            # slot lies at or after its destination (what the kernel needs for in-place moves).
            caches = [tensor for layer_cache in self.plain.cache for tensor in (layer_cache.k, layer_cache.v)]
            dst_starts = torch.full((1,), start + 1, device=self.device)
            kernel("kv_compact", self.device)(caches, start + verdict.path, verdict.accept_len, dst_starts)
        path_nodes = torch.cat([path.new_zeros(1), accepted_nodes])
        self._commit(state, out, path_nodes, new_tokens[: accepted + 1])
        depths_proposed = torch.zeros(self.num_positions, dtype=torch.bool, device=self.device)
        depths_proposed[layout.depths[1:] - 1] = True
        return _Round(new_host[: accepted + 1], accepted, num_nodes - 1, depths_proposed)

    # --- Medusa drafting ----------------------------------------------------------------

    def _medusa_round(self, state: _State, left: int, sampling: SamplingParams, generator) -> _Round:
        tree = self.static_tree
        depth = min(tree.max_depth, left - 1)
        if depth == 0:
            return self._verify_chain(state, state.pending_ids.new_zeros(1, 0), [], sampling, generator)
        num_nodes = sum(1 for node_depth in tree.depths if node_depth <= depth)  # nodes are depth-sorted
        last_hidden = state.pending_features[:, -1:]  # target final hidden before the root
        state.pending_features = state.pending_features[:, :0]
        state.pending_ids = state.pending_ids[:, :0]
        head_logits = self.drafter.logits(last_hidden)[:, 0, -1]  # [heads, V]
        if head_logits.shape[0] < depth:
            raise ValueError(f"medusa tree is {depth} deep but the drafter has {head_logits.shape[0]} heads")
        probs, log_probs = self._draft_distribution(head_logits[:depth], sampling)  # [depth, V]
        ranks_needed = max(tree.ranks[1:num_nodes]) + 1
        candidates, _ = select_children(log_probs, ranks_needed, not sampling.greedy, generator)
        depths = torch.tensor(tree.depths[:num_nodes], device=self.device)
        ranks = torch.tensor(tree.ranks[:num_nodes], device=self.device)
        tokens = candidates[(depths - 1).clamp_min(0), ranks]
        tokens[0] = state.last_token[0]
        parents = torch.tensor(tree.parents[:num_nodes], device=self.device)
        layout = tree_layout(parents, max_depth=depth, max_children=tree.max_children)
        # Every node at depth d draws its children from head d's distribution.
        node_probs = None if probs is None else probs[depths.clamp_max(depth - 1)]
        return self._verify_tree(state, layout, tokens, node_probs, sampling, generator)
