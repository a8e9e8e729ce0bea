"""EAGLE-3 for SGLang: `LlamaForCausalLMEagle3`.

Checked against SGLang 0.5.23 (PyPI wheel): srt/models/llama_eagle3.py (`LlamaModel`,
`LlamaForCausalLMEagle3.load_weights`) and the aux-state plumbing named in layer_ids.py.
  * weights: `fc.weight`, `midlayer.*` (0.5.23 maps the legacy `midlayer` to `layers.0`; older
    releases know only `midlayer`), `norm.weight`, `lm_head.weight`, `d2t` (read as
    hot_token_id = d2t + arange), `t2d` (skipped); `embed_tokens.weight` is loaded when present
    but the worker hands the draft the target's embedding, so we never write it.
  * config: a Llama config plus draft_vocab_size (absent = lm_head taken from the target),
    target_hidden_size, tie_word_embeddings (true = lm_head IS the embedding: must be false),
    eagle_config {eagle_aux_hidden_state_layer_ids (output-of-layer ids, SGLang adds 1),
    use_aux_hidden_state}. SGLang has none of the variant switches (norm_before_fc, fc_norm,
    norm_before_residual, norm_output, a sliding window; nor use_aux_norm, bias): a head that
    uses one is refused by name, on export and on import.
"""

from typing import Any

import torch

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
    TargetWeights,
    rename_prefix,
    require_keys,
    require_value,
    trained_dtype_name,
)
from heads.export.llama_config import geometry_from_fields, llama_fields
from heads.registry import WEIGHTS_FILE

ARCHITECTURE = "LlamaForCausalLMEagle3"
LAYER_PREFIX = "midlayer."


class SGLangEagle3(Eagle3Layout):
    layer_prefix = LAYER_PREFIX
    map_always_stored = True
    name = "sglang"
    kind = "eagle3"
    weights_file = WEIGHTS_FILE
    engine = "SGLang LlamaForCausalLMEagle3 (checked against sglang 0.5.23, srt/models/llama_eagle3.py)"
    serve_hint = (
        "python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 \\\n"
        "  --speculative-draft-model-path {dir} --speculative-num-steps {k} \\\n"
        "  --speculative-eagle-topk 1 --speculative-num-draft-tokens {k1}\n"
        "# SGLang only: vLLM 0.32 loads this directory too, but reads its layer ids in another\n"
        "# convention and accepts fewer drafts (tests/engines/); serve the vllm export there"
    )

    def config(self, head: Eagle3Head, meta: DrafterMeta) -> dict[str, Any]:
        args = head.args
        layer_ids = to_engine_layer_ids(args.target_layer_ids, self.name)
        check_expressible(head, self.name, supported=())
        return {
            "architectures": [ARCHITECTURE],
            **llama_fields(args.layer, args.vocab_size),
            "draft_vocab_size": args.draft_vocab_size,
            "target_hidden_size": args.layer.hidden_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, meta, self.name, layer_ids),
        }

    def tensors(self, head: Eagle3Head, target: TargetWeights) -> dict[str, torch.Tensor]:
        return eagle3_tensors(head, LAYER_PREFIX, vocab_map=True, target=None)

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """0.5.23 reads `layers.0.` as well (its legacy map goes the other way)."""
        return rename_prefix(tensors, "layers.0.", LAYER_PREFIX, where)

    def fields(self, config: dict[str, Any], where: str) -> Eagle3Fields:
        if ARCHITECTURE not in (config.get("architectures") or []):
            raise ValueError(
                f"{where}: config key 'architectures' = {config.get('architectures')!r} lacks {ARCHITECTURE!r}"
            )
        if config.get("eagle_aux_hidden_state_layer_ids") is not None:
            raise ValueError(
                f"{where}: config key 'eagle_aux_hidden_state_layer_ids' is vLLM's (input-of-layer ids, "
                "which SGLang ignores); read this directory with the vllm layout"
            )
        require_keys(config, ("draft_vocab_size",), where)
        require_value(config, "tie_word_embeddings", (False,), where)
        check_eagle3_switches(config, where)
        sliding_window(config, where, supported=False)
        eagle_config = config.get("eagle_config") or {}
        require_value(eagle_config, "use_aux_hidden_state", (True, None), f"{where} (eagle_config)")
        geometry = geometry_from_fields(config, where)
        return Eagle3Fields(
            geometry=geometry,
            vocab_size=config["vocab_size"],
            draft_vocab_size=config["draft_vocab_size"],
            target_hidden_size=config.get("target_hidden_size") or geometry.hidden_size,
            aux_layer_ids=aux_layer_ids(
                eagle_config.get("eagle_aux_hidden_state_layer_ids"),
                "eagle_config.eagle_aux_hidden_state_layer_ids",
                where,
            ),
        )
