"""EAGLE-3 in the speculators format (`Eagle3Speculator`), which vLLM loads as a model.

Checked against speculators 0.9.0 (PyPI wheel: config.py, models/eagle3/config.py,
models/eagle3/core.py `Eagle3DraftModel`, model.py `DraftVocabMixin`, proposals/greedy.py) and
vLLM 0.33.0 (transformers_utils/config.py, which treats a config holding
`speculators_config` as model_type "speculators"; configs/speculators/base.py and algos.py).
  * config: architectures ["Eagle3Speculator"], speculators_model_type "eagle3",
    speculators_version, speculators_config {algorithm, proposal_methods [{proposal_type
    "greedy", speculative_tokens, verifier_accept_k, accept_tolerance}],
    default_proposal_method, verifier {name_or_path, architectures}},
    transformer_layer_config (a Llama config: its model_type must be written, speculators
    0.9.0 falls back to Qwen3 without it), draft_vocab_size, target_hidden_size,
    eagle_aux_hidden_state_layer_ids (INPUT-of-layer ids, as vLLM), and the variant switches
    norm_before_residual, norm_before_fc, fc_norm, norm_output (plus a sliding window in
    transformer_layer_config: sliding_window, use_sliding_window, layer_types), all read and
    written as Eagle3DraftModel builds them. We write no top-level model_type: speculators' own
    to_dict drops it and vLLM infers it.
  * norm_before_residual must be written: vLLM's algos.py defaults it to TRUE for
    speculators configs while speculators defaults it to false. vLLM reads norm_before_residual
    (and, in releases after 0.33, norm_before_fc); the other switches only speculators' own
    model runs, so the model card names the ones a head uses.
  * weights: `layers.0.*`, `fc`, `norm`, `lm_head`, `embed_tokens.weight` (a copy of the
    target's), and `d2t` / `t2d` only when the draft vocabulary is reduced (DraftVocabMixin
    registers them only then; vLLM needs d2t, skips t2d).
"""

from typing import Any

import torch

from heads.eagle3 import Eagle3Head
from heads.export.card import DrafterMeta, drafter_section
from heads.export.eagle3_layout import (
    VARIANT_FLAGS,
    Eagle3Fields,
    Eagle3Layout,
    aux_layer_ids,
    check_eagle3_switches,
    eagle3_tensors,
    sliding_window,
)
from heads.export.layer_ids import to_engine_layer_ids
from heads.export.layouts import TargetWeights, require_keys, require_value, trained_dtype_name
from heads.export.llama_config import geometry_from_fields, llama_fields
from heads.registry import WEIGHTS_FILE

SPECULATORS_VERSION = "0.9.0"  # the release whose layout this module follows
LAYER_PREFIX = "layers.0."


class SpeculatorsEagle3(Eagle3Layout):
    layer_prefix = LAYER_PREFIX
    map_always_stored = False
    map_optional = ("t2d",)
    name = "speculators"
    kind = "eagle3"
    weights_file = WEIGHTS_FILE
    engine = (
        "vLLM (model_type speculators, checked against vllm 0.33.0) and the speculators library "
        f"Eagle3Speculator (checked against speculators {SPECULATORS_VERSION})"
    )
    serve_hint = "vllm serve {dir}   # the verifier named in config.json is loaded as the target"

    def config(self, head: Eagle3Head, meta: DrafterMeta) -> dict[str, Any]:
        args = head.args
        layer_ids = to_engine_layer_ids(args.target_layer_ids, self.name)
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "speculators_config": speculators_section("eagle3", meta.draft_length, meta),
            "transformer_layer_config": llama_fields(args.layer, args.vocab_size) | _window_fields(args),
            "draft_vocab_size": args.draft_vocab_size,
            "target_hidden_size": args.layer.hidden_size,
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            **{flag: getattr(args.variant, flag) for flag in VARIANT_FLAGS},
            "embed_requires_grad": False,
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, meta, self.name, layer_ids),
        }

    def tensors(self, head: Eagle3Head, target: TargetWeights) -> dict[str, torch.Tensor]:
        reduced = head.args.draft_vocab_size < head.args.vocab_size
        return eagle3_tensors(head, LAYER_PREFIX, vocab_map=reduced, target=target)

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        return tensors

    def fields(self, config: dict[str, Any], where: str) -> Eagle3Fields:
        require_value(config, "speculators_model_type", ("eagle3",), where)
        # norm_before_residual must be there: vLLM reads it missing as true, speculators as false.
        require_keys(
            config,
            ("speculators_config", "transformer_layer_config", "draft_vocab_size", "norm_before_residual"),
            where,
        )
        variant = check_eagle3_switches(config, where, supported=VARIANT_FLAGS)
        layer_config = config["transformer_layer_config"]
        if not isinstance(layer_config, dict):
            raise ValueError(f"{where}: config key 'transformer_layer_config' must be an object")
        inner = f"{where} (transformer_layer_config)"
        require_value(layer_config, "model_type", ("llama",), inner)
        variant |= sliding_window(layer_config, inner, supported=True)
        geometry = geometry_from_fields(layer_config, inner)
        return Eagle3Fields(
            geometry=geometry,
            vocab_size=layer_config["vocab_size"],
            draft_vocab_size=config["draft_vocab_size"],
            target_hidden_size=config.get("target_hidden_size") or geometry.hidden_size,
            aux_layer_ids=aux_layer_ids(
                config.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids", where
            ),
            variant=variant,
        )


def speculators_section(algorithm: str, speculative_tokens: int, meta: DrafterMeta) -> dict[str, Any]:
    """The `speculators_config` key: one greedy proposal method of speculative_tokens drafts (vLLM
    serves that many) and the verifier, which `vllm serve <export>` loads as the target."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": speculative_tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": meta.verifier, "architectures": list(meta.target_architectures)},
    }


def _window_fields(args) -> dict[str, Any]:
    """A sliding-window draft layer as speculators' CLI writes it (every layer sliding)."""
    if args.variant.sliding_window is None:
        return {}
    return {
        "sliding_window": args.variant.sliding_window,
        "use_sliding_window": True,
        "layer_types": ["sliding_attention"],
    }
