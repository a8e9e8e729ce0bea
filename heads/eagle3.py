"""EAGLE-3 draft head (SPEC.md section 4), in SGLang's `LlamaForCausalLMEagle3` parameter layout.

    fc                 [h, 3h]   fuses the target's low/middle/high hidden states
    midlayer           one decoder layer; q/k/v read [input_layernorm(embedding); hidden_norm(feature)]
                       (2h wide), the residual is the feature
    norm, lm_head      [draft_V, h] over the reduced draft vocab; d2t [draft_V] and t2d [V] map it
    embed_tokens       the TARGET's token embedding, a frozen parameter sharing the target's
                       storage; never saved (from_pretrained takes it again), export may add it

Feature and token pairing (the EAGLE shift): the feature of position t goes with the token at
t + 1, at RoPE position t, and the head's output predicts the token at t + 2. The pre-norm
output is the next step's feature (the normed one with `norm_output`, one of the speculators
variants `Eagle3Variant` lists). The training forward (`forward`) takes token-aligned
tensors and does the shift itself; the decode step (`step`) takes pairs the caller aligned.
Layer ids follow docs/ARCHITECTURE.md: id i = output of target layer i.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from heads.blocks import (
    Attention,
    LayerGeometry,
    RMSNorm,
    SwiGLU,
    causal_mask,
    last_positions,
    shift_left,
    unrolled_attention,
)
from heads.draft_vocab import DraftVocab
from heads.kv_cache import KVCache
from heads.registry import check_target_weight, load_trained_state, read_head, trained_state, write_head

NUM_FEATURE_LAYERS = 3


def default_layer_ids(num_layers: int) -> list[int]:
    """Low, middle and high layer outputs: [1, n // 2 - 1, n - 4] (SpecForge/ModelOpt ids)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


@dataclass
class Eagle3Variant:
    """Layer variants the peers train, by speculators 0.9's names. All off is SGLang's and
    SpecForge's layout, which every engine serves; speculators' CLI defaults turn norm_before_fc,
    norm_before_residual and norm_output on, with a 2048-token sliding window."""

    norm_before_fc: bool = False  # one RMSNorm over the 3h concatenation before fc (`input_norm`)
    fc_norm: bool = False  # one RMSNorm per feature layer before fc (`fc_norm.{i}`)
    norm_before_residual: bool = False  # the layer's residual is hidden_norm(feature), not the feature
    norm_output: bool = False  # the next step's feature is norm(hidden), not the pre-norm hidden
    sliding_window: int | None = None  # the layer attends to the last `sliding_window` context rows

    def check(self, where: str) -> None:
        if self.norm_before_fc and self.fc_norm:
            raise ValueError(
                f"{where}: norm_before_fc and fc_norm are mutually exclusive (speculators' rule)"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"{where}: sliding_window={self.sliding_window}; expected at least 1 or null")

    def active(self) -> dict:
        """The switches that are on (empty for the plain layout)."""
        return {key: value for key, value in asdict(self).items() if value not in (False, None)}


@dataclass
class Eagle3Args:
    """What the head is made of; saved as JSON beside the weights."""

    layer: LayerGeometry  # the midlayer: target sizes, Llama layout
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_layer_ids: list[int]  # output-of-layer ids (docs/ARCHITECTURE.md)
    target_num_layers: int
    variant: Eagle3Variant = field(default_factory=Eagle3Variant)

    def check_fits(self, target_config) -> None:
        """Raise a ValueError naming the first head field that does not fit the target config."""
        _check_field("hidden_size", self.layer.hidden_size, "hidden_size", target_config.hidden_size)
        _check_field("vocab_size", self.vocab_size, "vocab_size", target_config.vocab_size)
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"head config field 'draft_vocab_size' = {self.draft_vocab_size} must be in 1..{self.vocab_size} "
                "(the target's vocab_size)"
            )
        num_layers = target_config.num_hidden_layers
        ids = self.target_layer_ids
        if len(ids) != NUM_FEATURE_LAYERS or not all(0 <= i < num_layers for i in ids):
            raise ValueError(
                f"head config field 'target_layer_ids' = {ids} must be {NUM_FEATURE_LAYERS} layer ids in "
                f"0..{num_layers - 1} (the target has {num_layers} layers)"
            )
        _check_field("target_num_layers", self.target_num_layers, "num_hidden_layers", num_layers)


def _check_field(name: str, head_value, target_name: str, target_value) -> None:
    if head_value != target_value:
        raise ValueError(
            f"head config field {name!r} = {head_value} does not fit the target ({target_name} = {target_value})"
        )


@dataclass
class UnrolledSteps:
    """The training-time-test unroll: one [B, T, h] per step; row t of step k predicts token t + k + 2."""

    hidden_states: list[torch.Tensor]  # each is the next step's feature (pre-norm unless norm_output)
    normed_states: list[torch.Tensor]  # after `norm`: what lm_head reads


class Eagle3MidLayer(nn.Module):
    def __init__(self, geometry: LayerGeometry, norm_before_residual: bool = False):
        super().__init__()
        hidden, eps = geometry.hidden_size, geometry.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.self_attn = Attention(geometry, input_size=2 * hidden)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(geometry)
        self.norm_before_residual = norm_before_residual

    def _attention_input(
        self, embeds: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[input_layernorm(embeds); hidden_norm(features)] [B, S, 2h], and the residual [B, S, h]."""
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def _finish(self, residual: torch.Tensor, attention_out: torch.Tensor) -> torch.Tensor:
        hidden = residual + attention_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        cache_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """embeds, features [B, S, h] -> pre-norm hidden [B, S, h]; the rest as in `Attention.forward`."""
        attention_input, residual = self._attention_input(embeds, features)
        return self._finish(
            residual, self.self_attn(attention_input, positions, mask, cache, cache_positions)
        )

    def forward_unrolled(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        step0_mask: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        """One TTT step over all rows; appends this step's keys/values to `keys`/`values`."""
        attention_input, residual = self._attention_input(embeds, features)
        query, key, value = self.self_attn.project(attention_input, positions)
        keys.append(key)
        values.append(value)
        attended = unrolled_attention(query, keys, values, step0_mask)
        return self._finish(residual, self.self_attn.output(attended))


class Eagle3Head(nn.Module):
    kind = "eagle3"
    frozen_weights = ("embed_tokens.weight",)

    def __init__(
        self,
        args: Eagle3Args,
        embed_weight: torch.Tensor,
        draft_vocab: DraftVocab | None = None,
        lm_head_weight: torch.Tensor | None = None,
    ):
        """embed_weight [V, h]: the target's embedding (shared, frozen). draft_vocab: required unless
        draft_vocab_size == vocab_size. lm_head_weight [V, h]: the target's, to start lm_head from
        its draft-vocab rows (random init without it)."""
        super().__init__()
        hidden = args.layer.hidden_size
        self.args = args
        draft_vocab = DraftVocab.for_head(draft_vocab, args.draft_vocab_size, args.vocab_size)
        embed_weight = check_target_weight(embed_weight, (args.vocab_size, hidden), "embed_weight")
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight, freeze=True)  # the target's storage
        args.variant.check("EAGLE-3 head config")
        eps = args.layer.rms_norm_eps
        self.input_norm = RMSNorm(NUM_FEATURE_LAYERS * hidden, eps) if args.variant.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(RMSNorm(hidden, eps) for _ in range(NUM_FEATURE_LAYERS))
            if args.variant.fc_norm
            else None
        )
        self.fc = nn.Linear(NUM_FEATURE_LAYERS * hidden, hidden, bias=False)
        self.midlayer = Eagle3MidLayer(args.layer, args.variant.norm_before_residual)
        self.norm = RMSNorm(hidden, args.layer.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, args.draft_vocab_size, bias=False)
        self.register_buffer("d2t", draft_vocab.d2t.to(torch.int64).clone())
        self.register_buffer("t2d", draft_vocab.t2d.to(torch.bool).clone())
        if lm_head_weight is not None:
            lm_head_weight = check_target_weight(lm_head_weight, (args.vocab_size, hidden), "lm_head_weight")
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head_weight[self.draft_token_ids.to(lm_head_weight.device)])

    @torch.no_grad()
    def start_from_target_layer(self, layer: nn.Module) -> None:
        """Start the decoder layer as a copy of a target decoder layer (HF's or ours: the same
        parameter names) and fc as passing the highest feature layer through, so the draft begins
        as one more target layer over the target's own states instead of noise. The embedding half
        of q/k/v keeps its random start: the target layer has no counterpart for it."""
        hidden = self.args.layer.hidden_size
        mine, theirs = self.midlayer.self_attn, layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            ours, source = getattr(mine, name), getattr(theirs, name)
            ours.weight[:, hidden:] = source.weight
            if ours.bias is not None:
                ours.bias.copy_(source.bias)
        mine.o_proj.load_state_dict(theirs.o_proj.state_dict())
        if mine.qk_norm:
            mine.q_norm.weight.copy_(theirs.q_norm.weight)
            mine.k_norm.weight.copy_(theirs.k_norm.weight)
        self.midlayer.mlp.load_state_dict(layer.mlp.state_dict())
        self.midlayer.hidden_norm.weight.copy_(layer.input_layernorm.weight)
        self.midlayer.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
        self.fc.weight.zero_()
        self.fc.weight[:, (NUM_FEATURE_LAYERS - 1) * hidden :] = torch.eye(hidden)

    @classmethod
    def from_target(
        cls,
        target_config,
        *,
        embed_weight: torch.Tensor,
        draft_vocab: DraftVocab,
        target_layer_ids: Sequence[int] | None = None,
        lm_head_weight: torch.Tensor | None = None,
        variant: Eagle3Variant | None = None,
    ) -> "Eagle3Head":
        """A fresh head for a target; target_layer_ids None -> `default_layer_ids`."""
        num_layers = target_config.num_hidden_layers
        args = Eagle3Args(
            layer=LayerGeometry.from_config(target_config).draft_layout(),
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab.d2t.numel(),
            target_layer_ids=list(
                default_layer_ids(num_layers) if target_layer_ids is None else target_layer_ids
            ),
            target_num_layers=num_layers,
            variant=replace(variant) if variant is not None else Eagle3Variant(),
        )
        args.check_fits(target_config)
        return cls(args, embed_weight, draft_vocab, lm_head_weight)

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        embed_weight: torch.Tensor,
        lm_head_weight: torch.Tensor | None = None,
        target_config=None,
    ) -> "Eagle3Head":
        """Load a saved head; embed_weight is the target's; lm_head_weight is unused (uniform API)."""
        args, tensors = read_head(path, cls.kind, Eagle3Args)
        if target_config is not None:
            args.check_fits(target_config)
        head = cls(args, embed_weight, DraftVocab.saved(tensors, str(path)))
        load_trained_state(head, tensors, cls.frozen_weights, str(path))
        return head

    def save_pretrained(self, path) -> None:
        write_head(path, self.kind, self.args, trained_state(self, self.frozen_weights))

    # Decode API (eval/decoder.py).

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.args.target_layer_ids)

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """int64 [draft_V]: the target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def project_features(
        self, hidden_states: Sequence[torch.Tensor], final_hidden: torch.Tensor | None
    ) -> torch.Tensor:
        """The target's hidden states at target_layer_ids (3 x [B, S, h]) -> step-0 features [B, S, h]."""
        if len(hidden_states) != NUM_FEATURE_LAYERS:
            raise ValueError(
                f"EAGLE-3 needs {NUM_FEATURE_LAYERS} target hidden states, got {len(hidden_states)}"
            )
        dtype = self.fc.weight.dtype
        if self.fc_norm is not None:
            hidden_states = [norm(h.to(dtype)) for norm, h in zip(self.fc_norm, hidden_states, strict=True)]
        concatenated = torch.cat(list(hidden_states), dim=-1).to(dtype)  # [B, S, 3h]
        if self.input_norm is not None:
            concatenated = self.input_norm(concatenated)
        return self.fc(concatenated)

    def new_cache(self, batch_size: int, max_len: int, device, dtype: torch.dtype) -> list[KVCache]:
        layer = self.args.layer
        return [
            KVCache(
                batch_size, layer.num_key_value_heads, max_len, layer.head_dim, dtype=dtype, device=device
            )
        ]

    def step(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: list[KVCache] | None,
        cache_positions: torch.Tensor | None,
        attn_mask: torch.Tensor,
        num_logits: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward over S aligned pairs.

        features [B, S, h] (projected, or a previous step's hidden); input_ids [B, S] = the token
        after each feature's position; positions [B, S] = the feature's position; K/V written at
        cache_positions [S]; attn_mask bool [B or 1, 1, S, max_len] (True = attend; [.., S, S]
        without a cache). Returns the next step's feature [B, S, h] (the pre-norm hidden unless
        norm_output) and draft_logits [B, S, draft_V], or [B, num_logits, draft_V] for the last
        num_logits positions only (a catch-up reads its last: the lm_head is most of a step).
        """
        layer_cache = cache[0] if cache is not None else None
        embeds = self.embed_tokens(input_ids)
        if self.args.variant.sliding_window is not None:
            attn_mask = attn_mask & self._window(positions, attn_mask.shape[-1])
        hidden = self.midlayer(embeds, features, positions, attn_mask, layer_cache, cache_positions)
        normed = self.norm(hidden)
        logits = self.lm_head(last_positions(normed, num_logits))
        return (normed if self.args.variant.norm_output else hidden), logits

    def _window(self, positions: torch.Tensor, num_keys: int) -> torch.Tensor:
        """bool [B, 1, S, num_keys]: key slot j is within the window of the query at position t
        iff j > t - sliding_window. Drafted tokens sit at slots past the context, so they stay
        visible, as speculators' diagonal draft keys do."""
        slots = torch.arange(num_keys, device=positions.device)
        return slots[None, None, None, :] > positions[:, None, :, None] - self.args.variant.sliding_window

    # Training.

    def forward(
        self,
        features: Sequence[torch.Tensor],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
    ) -> UnrolledSteps:
        """Training-time test: unroll `num_steps` steps over whole sequences.

        features: the target's hidden states at target_layer_ids, 3 x [B, T, h]; input_ids and
        attention_mask [B, T], token-aligned. Step k, row t: the pair (step k - 1's output at row t,
        token t + k + 1) at position t + k, predicting token t + k + 2 (ground-truth tokens at every
        step, as SpecForge). Rows past the end read token 0 and must be masked by the loss.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps} must be >= 1")
        batch, seq = input_ids.shape
        hidden = self.project_features(features, None)
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        step0_mask = causal_mask(attention_mask)
        if self.args.variant.sliding_window is not None:
            step0_mask = step0_mask & self._window(torch.arange(seq, device=input_ids.device)[None], seq)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        unrolled = UnrolledSteps(hidden_states=[], normed_states=[])
        for step in range(num_steps):
            tokens = shift_left(input_ids, step + 1)
            hidden = self.midlayer.forward_unrolled(
                self.embed_tokens(tokens), hidden, positions + step, step0_mask, keys, values
            )
            normed = self.norm(hidden)
            if self.args.variant.norm_output:
                hidden = normed  # speculators feeds the normed state to the next step
            unrolled.hidden_states.append(hidden)
            unrolled.normed_states.append(normed)
        return unrolled
