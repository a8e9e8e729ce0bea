"""The EAGLE-3 weight table shared by the SGLang, vLLM and speculators layouts.

All three engines read one Llama decoder layer whose q/k/v take [embedding; feature] (2h),
plus `fc` [h, 3 * target_h], `norm`, `lm_head` [draft_V, h] and the draft-vocab map
(`d2t`: target_id = d + d2t[d]; `t2d`: bool over the target vocab). They differ in the
layer's prefix (`midlayer.` or `layers.0.`), in whether the map and a copy of the target's
embedding are stored, and in how the config names things (their modules say).
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from heads.blocks import LayerGeometry
from heads.eagle3 import Eagle3Args, Eagle3Head, Eagle3Variant, default_layer_ids
from heads.export.layer_ids import from_engine_layer_ids
from heads.export.layouts import (
    CannotExpress,
    NoSideFiles,
    TargetWeights,
    TensorSpec,
    check_matches_target,
    draft_vocab_from_tensors,
    require_value,
)
from heads.registry import load_trained_state, trained_state

OUR_LAYER_PREFIX = "midlayer."


@dataclass(frozen=True)
class Eagle3Fields:
    """An EAGLE-3 drafter as an engine config describes it."""

    geometry: LayerGeometry
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] | None  # in the engine's convention; None = the engine default
    variant: dict[str, Any] = field(default_factory=dict)  # Eagle3Args variant switches that are set


def eagle3_specs(
    fields: Eagle3Fields, layer_prefix: str, vocab_map: bool, map_optional: tuple[str, ...] = ()
) -> dict[str, TensorSpec]:
    """name -> shape/dtype, as SGLang 0.5.23 / vLLM 0.33 `llama_eagle3.py` and speculators 0.9.0
    `Eagle3DraftModel` allocate them. All three load `embed_tokens.weight` [V, h] when present
    (a copy of the target's); `map_optional`: the d2t/t2d an engine does without."""
    g = fields.geometry
    hidden, inner, p = g.hidden_size, g.intermediate_size, layer_prefix
    q_out, kv_out = g.num_attention_heads * g.head_dim, g.num_key_value_heads * g.head_dim
    specs = {
        "fc.weight": TensorSpec((hidden, 3 * fields.target_hidden_size)),
        f"{p}self_attn.q_proj.weight": TensorSpec((q_out, 2 * hidden)),
        f"{p}self_attn.k_proj.weight": TensorSpec((kv_out, 2 * hidden)),
        f"{p}self_attn.v_proj.weight": TensorSpec((kv_out, 2 * hidden)),
        f"{p}self_attn.o_proj.weight": TensorSpec((hidden, q_out)),
        f"{p}mlp.gate_proj.weight": TensorSpec((inner, hidden)),
        f"{p}mlp.up_proj.weight": TensorSpec((inner, hidden)),
        f"{p}mlp.down_proj.weight": TensorSpec((hidden, inner)),
        f"{p}input_layernorm.weight": TensorSpec((hidden,)),
        f"{p}hidden_norm.weight": TensorSpec((hidden,)),
        f"{p}post_attention_layernorm.weight": TensorSpec((hidden,)),
        "norm.weight": TensorSpec((hidden,)),
        "lm_head.weight": TensorSpec((fields.draft_vocab_size, hidden)),
    }
    if fields.variant.get("norm_before_fc"):
        specs["input_norm.weight"] = TensorSpec((3 * fields.target_hidden_size,))
    if fields.variant.get("fc_norm"):
        specs |= {f"fc_norm.{i}.weight": TensorSpec((fields.target_hidden_size,)) for i in range(3)}
    if vocab_map:
        specs["d2t"] = TensorSpec((fields.draft_vocab_size,), torch.int64, optional="d2t" in map_optional)
        specs["t2d"] = TensorSpec((fields.vocab_size,), torch.bool, optional="t2d" in map_optional)
    specs["embed_tokens.weight"] = TensorSpec((fields.vocab_size, hidden), optional=True)
    return specs


def eagle3_tensors(
    head: Eagle3Head, layer_prefix: str, vocab_map: bool, target: TargetWeights | None
) -> dict[str, torch.Tensor]:
    """The head's trained tensors under an engine's names; `target` given = add its embedding."""
    tensors = {}
    for name, tensor in trained_state(head, Eagle3Head.frozen_weights).items():
        if name in ("d2t", "t2d") and not vocab_map:
            continue
        tensors[
            layer_prefix + name.removeprefix(OUR_LAYER_PREFIX) if name.startswith(OUR_LAYER_PREFIX) else name
        ] = tensor
    if target is not None:
        tensors["embed_tokens.weight"] = target.embed_weight.detach().to(head.fc.weight.dtype)
    return tensors


def eagle3_load(
    fields: Eagle3Fields,
    tensors: dict[str, torch.Tensor],
    target: TargetWeights,
    engine: str,
    layer_prefix: str,
    float_dtype: torch.dtype,
    where: str,
) -> Eagle3Head:
    """Our head from checked tensors; the layer ids are converted from `engine`'s convention."""
    if fields.target_hidden_size != fields.geometry.hidden_size:
        raise ValueError(
            f"{where}: target_hidden_size={fields.target_hidden_size} differs from hidden_size="
            f"{fields.geometry.hidden_size}; our EAGLE-3 head needs the draft layer as wide as the target"
        )
    num_layers = target.config.num_hidden_layers
    layer_ids = (
        default_layer_ids(num_layers)
        if fields.aux_layer_ids is None
        else from_engine_layer_ids(fields.aux_layer_ids, engine, num_layers)
    )
    args = Eagle3Args(
        layer=fields.geometry,
        vocab_size=fields.vocab_size,
        draft_vocab_size=fields.draft_vocab_size,
        target_layer_ids=layer_ids,
        target_num_layers=num_layers,
        variant=Eagle3Variant(**fields.variant),
    )
    args.variant.check(where)
    args.check_fits(target.config)
    if "embed_tokens.weight" in tensors:
        check_matches_target(
            tensors["embed_tokens.weight"], target.embed_weight, "embed_tokens.weight", where
        )
    vocab = draft_vocab_from_tensors(tensors, fields.draft_vocab_size, fields.vocab_size, where)
    head = Eagle3Head(args, target.embed_weight, vocab).to(float_dtype)
    ours = {
        OUR_LAYER_PREFIX + name.removeprefix(layer_prefix) if name.startswith(layer_prefix) else name: tensor
        for name, tensor in tensors.items()
        if name != "embed_tokens.weight"
    }
    ours.setdefault("d2t", head.d2t)
    ours.setdefault("t2d", head.t2d)
    load_trained_state(head, ours, Eagle3Head.frozen_weights, where)
    return head.eval()


# The boolean variant switches of Eagle3Args, as the configs name them (speculators 0.9's names).
VARIANT_FLAGS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")
# Switches of other engines that our head does not have: off or absent, or we refuse.
UNSUPPORTED_SWITCHES = ("use_aux_norm", "bias")


def check_expressible(head: Eagle3Head, layout_name: str, supported: tuple[str, ...]) -> None:
    unsupported = {key: value for key, value in head.args.variant.active().items() if key not in supported}
    if unsupported:
        raise CannotExpress(
            f"the {layout_name} layout cannot express head option(s) {unsupported}: its engine has no such "
            "setting, so it would run a different drafter; export the speculators layout, which carries them"
        )


def check_eagle3_switches(config: dict, where: str, supported: tuple[str, ...] = ()) -> dict[str, Any]:
    """The variant flags `config` sets, among `supported` (absent = off); any other must be off."""
    variant = {}
    for key in VARIANT_FLAGS:
        if key not in supported:
            require_value(config, key, (False, None), where)
        elif config.get(key) is not None:
            require_value(config, key, (True, False), where)
            variant[key] = config[key]
    for key in UNSUPPORTED_SWITCHES:
        require_value(config, key, (False, None), where)
    require_value(config, "num_aux_hidden_states", (3, None), where)
    return variant


def sliding_window(layer_config: dict, where: str, supported: bool) -> dict[str, Any]:
    """{"sliding_window": w} when the draft layer's `layer_types` make it a sliding-window layer
    (as speculators' CLI writes it), else {}; a layout whose engine we did not check refuses it."""
    layer_types = layer_config.get("layer_types") or []
    if not layer_types or layer_types[0] != "sliding_attention":
        return {}
    if not supported:
        raise ValueError(
            f"{where}: config key 'layer_types' = {layer_types!r} makes the draft layer a sliding-window layer, "
            "which this layout does not carry; read it with the speculators layout"
        )
    window = layer_config.get("sliding_window")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"{where}: config key 'sliding_window' = {window!r} must be a positive integer")
    return {"sliding_window": window}


def aux_layer_ids(ids, key: str, where: str) -> list[int] | None:
    """Three layer ids, or None when the config leaves the choice to the engine."""
    if ids is None:
        return None
    if not isinstance(ids, list) or len(ids) != 3 or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{where}: config key {key!r} = {ids!r} must list 3 layer ids")
    return ids


class Eagle3Layout(NoSideFiles):
    """What the three EAGLE-3 layouts share: their tensor table and loader, parametrised by the
    layer prefix and by whether the draft-vocab map may be left out (full-vocab heads)."""

    name: str
    layer_prefix: str
    map_always_stored: bool  # True: d2t/t2d are required even for a full-vocab head
    map_optional: tuple[str, ...] = ()

    def fields(self, config: dict[str, Any], where: str) -> Eagle3Fields:
        raise NotImplementedError

    def expected(self, config: dict[str, Any], target: TargetWeights, where: str) -> dict[str, TensorSpec]:
        fields = self.fields(config, where)
        vocab_map = self.map_always_stored or fields.draft_vocab_size < fields.vocab_size
        return eagle3_specs(fields, self.layer_prefix, vocab_map=vocab_map, map_optional=self.map_optional)

    def load(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        target: TargetWeights,
        float_dtype: torch.dtype,
        where: str,
    ) -> nn.Module:
        return eagle3_load(
            self.fields(config, where), tensors, target, self.name, self.layer_prefix, float_dtype, where
        )
