"""The Llama config fields every EAGLE layout carries, to and from our `LayerGeometry`.

Engines build the draft layer from these with their own Llama code, so the fields are the
plain Llama ones (rope_theta + rope_scaling, which transformers 5 still reads into
rope_parameters, as SGLang 0.5.23 and vLLM 0.33 do). Reading goes through transformers'
LlamaConfig and heads.blocks, the same path the target's geometry took.

A block drafter's layers are Qwen3 layers (the same fields plus per-head q/k RMSNorm, which
model_type "qwen3" implies), and it has num_layers of them: `qwen3_fields` and
`qwen3_geometry_from_fields`.
"""

from typing import Any

from transformers import LlamaConfig, Qwen3Config

from heads.blocks import LayerGeometry
from heads.export.layouts import require_keys, require_value

REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "rms_norm_eps", "vocab_size")
GEOMETRY_FIELDS = (
    *REQUIRED_FIELDS,
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "hidden_act",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
)


def _rope_scaling(geometry: LayerGeometry) -> dict[str, Any] | None:
    rope = geometry.rope
    if rope.rope_type == "default":
        return None
    if rope.rope_type == "linear":
        return {"rope_type": "linear", "factor": rope.factor}
    return {
        "rope_type": "llama3",
        "factor": rope.factor,
        "low_freq_factor": rope.low_freq_factor,
        "high_freq_factor": rope.high_freq_factor,
        "original_max_position_embeddings": rope.original_max_position_embeddings,
    }


def llama_fields(geometry: LayerGeometry, vocab_size: int) -> dict[str, Any]:
    """A one-layer Llama config describing a draft layer of `geometry`."""
    return {
        "model_type": "llama",
        "hidden_size": geometry.hidden_size,
        "intermediate_size": geometry.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": geometry.num_attention_heads,
        "num_key_value_heads": geometry.num_key_value_heads,
        "head_dim": geometry.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": geometry.rms_norm_eps,
        "max_position_embeddings": geometry.max_position_embeddings,
        "rope_theta": geometry.rope.rope_theta,
        "rope_scaling": _rope_scaling(geometry),
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
    }


def qwen3_fields(geometry: LayerGeometry, vocab_size: int, num_layers: int) -> dict[str, Any]:
    """A Qwen3 config describing num_layers draft layers of `geometry` (q/k norm included)."""
    return llama_fields(geometry, vocab_size) | {"model_type": "qwen3", "num_hidden_layers": num_layers}


def _geometry(fields: dict[str, Any], config_class, where: str) -> LayerGeometry:
    """Our geometry through transformers' config class, as the target's was read."""
    require_keys(fields, REQUIRED_FIELDS, where)
    for flag in ("attention_bias", "mlp_bias"):
        require_value(fields, flag, (False, None), where)
    known = {key: fields[key] for key in GEOMETRY_FIELDS if fields.get(key) is not None}
    try:
        return LayerGeometry.from_config(config_class(**known))
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(
            f"{where}: the {config_class.model_type} fields of config.json do not describe a draft layer: {error}"
        ) from error


def geometry_from_fields(fields: dict[str, Any], where: str) -> LayerGeometry:
    """Our geometry from a Llama config dict; a field our draft layers cannot honour is an error."""
    require_value(fields, "model_type", ("llama", None), where)
    require_value(fields, "num_hidden_layers", (1, None), where)
    return _geometry(fields, LlamaConfig, where).draft_layout()


def qwen3_geometry_from_fields(fields: dict[str, Any], where: str) -> tuple[LayerGeometry, int]:
    """Our geometry (q/k norm on) and the number of layers from a Qwen3 config dict."""
    require_value(fields, "model_type", ("qwen3",), where)
    layers = fields.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(f"{where}: config key 'num_hidden_layers' = {layers!r} must be a positive integer")
    return _geometry(fields, Qwen3Config, where), layers
