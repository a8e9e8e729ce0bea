"""EAGLE-3 and EAGLE-1 for vLLM: `Eagle3LlamaForCausalLM` and `EagleLlamaForCausalLM`.

Checked against vLLM 0.33.0 (PyPI wheel): model_executor/models/llama_eagle3.py,
llama_eagle.py, transformers_utils/configs/eagle.py, v1/worker/gpu_model_runner.py.

EAGLE-3
  * weights: `layers.0.*` (the loader maps a legacy `midlayer.` to it, so we read both), `fc`,
    `norm`, `lm_head` [draft_V, h], `d2t` on disk (renamed to `draft_id_to_target_id` inside
    vLLM: a file that stores `draft_id_to_target_id` itself has it silently dropped, leaving a
    zero map); `t2d` is skipped; with draft_vocab_size == vocab_size vLLM has no map and
    rejects a `d2t`, so a full-vocabulary head stores neither. `embed_tokens.weight` is
    loaded when present (we never write it: the target's is shared).
  * config: Llama fields + draft_vocab_size, target_hidden_size, top-level
    eagle_aux_hidden_state_layer_ids (INPUT-of-layer ids, used as is), norm_before_residual
    (vLLM default false; written as the head has it). vLLM 0.33's draft layer has no other
    variant switch (norm_before_fc, fc_norm, norm_output, a sliding window): a head using one
    is refused by name (the speculators layout carries them). Without
    top-level ids vLLM 0.33 reads eagle_config's list, ALSO as input-of-layer ids, while SGLang
    reads that list as output-of-layer ids: such a config is ambiguous and we refuse it.
    architectures: EAGLEConfig keeps names that start or end with Eagle3 and prefixes others,
    so `Eagle3LlamaForCausalLM` stays; SGLang has no such class, so an SGLang server refuses
    this directory instead of misreading its ids.
EAGLE-1
  * weights: `fc.weight` [h, 2h] on [embedding; feature], `layers.0.*` without
    input_layernorm (an nn.Identity there); embed_tokens / lm_head loaded when present, else
    shared from the target. config: a one-layer Llama config.
"""

from typing import Any

import torch
from torch import nn

from heads.eagle1 import Eagle1Args, Eagle1Head
from heads.eagle3 import Eagle3Head
from heads.export.card import DrafterMeta, drafter_section
from heads.export.eagle3_layout import (
    Eagle3Fields,
    Eagle3Layout,
    aux_layer_ids,
    check_eagle3_switches,
    check_expressible,
    eagle3_tensors,
    sliding_window,
)
from heads.export.layer_ids import to_engine_layer_ids
from heads.export.layouts import (
    NoSideFiles,
    TargetWeights,
    TensorSpec,
    check_matches_target,
    rename_prefix,
    require_value,
    trained_dtype_name,
)
from heads.export.llama_config import geometry_from_fields, llama_fields
from heads.registry import WEIGHTS_FILE, load_trained_state, trained_state

LAYER_PREFIX = "layers.0."
LEGACY_LAYER_PREFIX = "midlayer."
EAGLE3_ARCHITECTURE = "Eagle3LlamaForCausalLM"
EAGLE3_ARCHITECTURES_READ = (EAGLE3_ARCHITECTURE, "LlamaForCausalLMEagle3", "LlamaForCausalLM")
EAGLE1_ARCHITECTURE = "EagleLlamaForCausalLM"
EAGLE1_ARCHITECTURES_READ = (EAGLE1_ARCHITECTURE, "LlamaForCausalLM")
VLLM_SWITCHES = ("norm_before_residual",)  # the EAGLE-3 variant switches vLLM 0.33's draft layer reads


def _check_architectures(config: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    names = config.get("architectures") or []
    if not any(name in allowed for name in names):
        raise ValueError(f"{where}: config key 'architectures' = {names!r} names none of {list(allowed)}")


class VLLMEagle3(Eagle3Layout):
    layer_prefix = LAYER_PREFIX
    map_always_stored = False
    map_optional = ("t2d",)
    name = "vllm"
    kind = "eagle3"
    weights_file = WEIGHTS_FILE
    engine = (
        "vLLM Eagle3LlamaForCausalLM (checked against vllm 0.33.0, model_executor/models/llama_eagle3.py)"
    )
    serve_hint = (
        "vllm serve {target} --speculative-config "
        '\'{{"method": "eagle3", "model": "{dir}", "num_speculative_tokens": {k}}}\''
    )

    def config(self, head: Eagle3Head, meta: DrafterMeta) -> dict[str, Any]:
        args = head.args
        check_expressible(head, self.name, supported=VLLM_SWITCHES)
        layer_ids = to_engine_layer_ids(args.target_layer_ids, self.name)
        return {
            "architectures": [EAGLE3_ARCHITECTURE],
            **llama_fields(args.layer, args.vocab_size),
            "draft_vocab_size": args.draft_vocab_size,
            "target_hidden_size": args.layer.hidden_size,
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            "norm_before_residual": args.variant.norm_before_residual,
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, meta, self.name, layer_ids),
        }

    def tensors(self, head: Eagle3Head, target: TargetWeights) -> dict[str, torch.Tensor]:
        reduced = head.args.draft_vocab_size < head.args.vocab_size
        return eagle3_tensors(head, LAYER_PREFIX, vocab_map=reduced, target=None)

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """vLLM's hf_to_vllm_mapper: `midlayer.` -> `layers.0.`."""
        return rename_prefix(tensors, LEGACY_LAYER_PREFIX, LAYER_PREFIX, where)

    def fields(self, config: dict[str, Any], where: str) -> Eagle3Fields:
        _check_architectures(config, EAGLE3_ARCHITECTURES_READ, where)
        variant = check_eagle3_switches(config, where, supported=VLLM_SWITCHES)
        sliding_window(config, where, supported=False)
        eagle_config = config.get("eagle_config") or {}
        require_value(eagle_config, "use_aux_hidden_state", (True, None), f"{where} (eagle_config)")
        geometry = geometry_from_fields(config, where)
        if (
            config.get("eagle_aux_hidden_state_layer_ids") is None
            and "eagle_aux_hidden_state_layer_ids" in eagle_config
        ):
            raise ValueError(
                f"{where}: only eagle_config.eagle_aux_hidden_state_layer_ids names the layers: SGLang reads "
                "them as output-of-layer ids, vLLM 0.33 as input-of-layer ids; read this directory with the "
                "sglang layout, or write the vLLM ids at the top level"
            )
        return Eagle3Fields(
            geometry=geometry,
            vocab_size=config["vocab_size"],
            draft_vocab_size=config.get("draft_vocab_size") or config["vocab_size"],
            target_hidden_size=config.get("target_hidden_size") or geometry.hidden_size,
            aux_layer_ids=aux_layer_ids(
                config.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids", where
            ),
            variant=variant,
        )


class VLLMEagle1(NoSideFiles):
    name = "vllm"
    kind = "eagle1"
    weights_file = WEIGHTS_FILE
    engine = "vLLM EagleLlamaForCausalLM (checked against vllm 0.33.0, model_executor/models/llama_eagle.py)"
    serve_hint = (
        "vllm serve {target} --speculative-config "
        '\'{{"method": "eagle", "model": "{dir}", "num_speculative_tokens": {k}}}\''
    )

    def config(self, head: Eagle1Head, meta: DrafterMeta) -> dict[str, Any]:
        return {
            "architectures": [EAGLE1_ARCHITECTURE],
            **llama_fields(head.args.layer, head.args.vocab_size),
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, meta, self.name, None),
        }

    def tensors(self, head: Eagle1Head, target: TargetWeights) -> dict[str, torch.Tensor]:
        return dict(trained_state(head, Eagle1Head.frozen_weights))  # already vLLM's names

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        return tensors

    def expected(self, config: dict[str, Any], target: TargetWeights, where: str) -> dict[str, TensorSpec]:
        _check_architectures(config, EAGLE1_ARCHITECTURES_READ, where)
        require_value(config, "add_para_norm", (False, None), where)  # HASS's extra norms
        g = geometry_from_fields(config, where)
        hidden, inner, vocab = g.hidden_size, g.intermediate_size, config["vocab_size"]
        q_out, kv_out = g.num_attention_heads * g.head_dim, g.num_key_value_heads * g.head_dim
        return {
            "fc.weight": TensorSpec((hidden, 2 * hidden)),
            "layers.0.self_attn.q_proj.weight": TensorSpec((q_out, hidden)),
            "layers.0.self_attn.k_proj.weight": TensorSpec((kv_out, hidden)),
            "layers.0.self_attn.v_proj.weight": TensorSpec((kv_out, hidden)),
            "layers.0.self_attn.o_proj.weight": TensorSpec((hidden, q_out)),
            "layers.0.mlp.gate_proj.weight": TensorSpec((inner, hidden)),
            "layers.0.mlp.up_proj.weight": TensorSpec((inner, hidden)),
            "layers.0.mlp.down_proj.weight": TensorSpec((hidden, inner)),
            "layers.0.post_attention_layernorm.weight": TensorSpec((hidden,)),
            "embed_tokens.weight": TensorSpec((vocab, hidden), optional=True),
            "lm_head.weight": TensorSpec((vocab, hidden), optional=True),
        }

    def load(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        target: TargetWeights,
        float_dtype: torch.dtype,
        where: str,
    ) -> nn.Module:
        args = Eagle1Args(layer=geometry_from_fields(config, where), vocab_size=config["vocab_size"])
        args.check_fits(target.config)
        shared = {"embed_tokens.weight": target.embed_weight, "lm_head.weight": target.lm_head_weight}
        for name, weight in shared.items():
            if name in tensors:
                check_matches_target(tensors[name], weight, name, where)
        head = Eagle1Head(args, target.embed_weight, target.lm_head_weight).to(float_dtype)
        trained = {name: t for name, t in tensors.items() if name not in shared}
        load_trained_state(head, trained, Eagle1Head.frozen_weights, where)
        return head.eval()
