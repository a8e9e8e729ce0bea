"""DFlash (the block drafter, heads/dflash.py) in the speculators format, which vLLM serves.

Checked against vLLM 0.32.0 (PyPI CPU wheel): transformers_utils/configs/speculators/algos.py
`update_dflash`, model_executor/models/qwen3_dflash.py `DFlashQwen3ForCausalLM`,
v1/spec_decode/dflash.py, v1/worker/gpu/spec_decode/eagle/eagle3_utils.py; and against
speculators' models/dflash/config.py `DFlashSpeculatorConfig` and core.py `DFlashDraftModel`.
  * config: architectures ["DFlashSpeculator"], speculators_model_type "dflash",
    speculators_config (algorithm "dflash", one greedy proposal of block_size - 1 tokens),
    transformer_layer_config (a Qwen3 config; num_hidden_layers = the draft layers),
    draft_vocab_size, target_hidden_size, block_size, mask_token_id, and
    aux_hidden_state_layer_ids: INPUT-of-layer ids, which vLLM uses as is for the target
    (eagle_aux_hidden_state_layer_ids) and as id - 1 for the drafter (dflash_config.target_layer_ids).
  * vLLM drafts num_speculative_tokens mask slots after the anchor in ONE non-causal block, so a
    K other than block_size - 1 runs a block the head was not trained on: speculative_tokens is
    block_size - 1, and a config saying otherwise is refused.
  * sliding_window_non_causal is written true: vLLM 0.32 sets dflash_config.causal = not
    sliding_window_non_causal (absent: true) and that makes EVERY draft layer causal inside the
    block, while speculators reads the flag for sliding-window layers only (default false). Our
    block is bidirectional; true (or absent) is read that way by both, false is refused.
  * weights: `layers.{i}.*` (Qwen3 layers: q_norm / k_norm), `fc` [h, n * h], `hidden_norm`,
    `norm`, `lm_head` [draft_V, h]; `d2t` / `t2d` only with a reduced vocabulary (vLLM renames
    d2t, skips t2d, and has no map for a full one). No embed_tokens: vLLM shares the target's
    (a stored copy must be the target's). A full-vocabulary checkpoint without lm_head (as
    speculators saves one) runs the target's.
  * mask_embedding.pt = {"mask_token_id", "embedding" [h]} (or a bare tensor): vLLM opens it by
    name (its weight glob reads only *.safetensors) and uses it wherever an input id equals
    mask_token_id: the mask slots, and also an anchor that is that token, so the id should be
    one the target does not emit. Without the file vLLM uses embed_tokens[mask_token_id], which
    is what an import without it gets. A `mask_embedding` in model.safetensors is dropped by
    vLLM: refused. speculators' own DFlashDraftModel has no mask embedding (it embeds
    mask_token_id with the target's table), so the file is for vLLM.
"""

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from heads.dflash import DFlashArgs, DFlashHead
from heads.export.card import DrafterMeta, drafter_section
from heads.export.layer_ids import from_engine_layer_ids, to_engine_layer_ids
from heads.export.layouts import (
    TargetWeights,
    TensorSpec,
    check_matches_target,
    draft_vocab_from_tensors,
    require_keys,
    require_value,
    trained_dtype_name,
)
from heads.export.llama_config import qwen3_fields, qwen3_geometry_from_fields
from heads.export.speculators import SPECULATORS_VERSION, speculators_section
from heads.registry import WEIGHTS_FILE, load_trained_state, trained_state

MASK_EMBEDDING_FILE = "mask_embedding.pt"
MASK_EMBEDDING = "mask_embedding"  # our parameter, and vLLM's


def _check_speculative_tokens(config: dict[str, Any], where: str) -> None:
    try:
        tokens = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    except (KeyError, IndexError, TypeError):
        tokens = None  # vLLM refuses such a config too
    if tokens != config["block_size"] - 1:
        raise ValueError(
            f"{where}: speculators_config.proposal_methods[0].speculative_tokens = {tokens} with block_size = "
            f"{config['block_size']}: vLLM would draft a block of {tokens} + 1 slots, not the trained block "
            "(speculative_tokens must be block_size - 1)"
        )


class SpeculatorsDFlash:
    name = "speculators"
    kind = "dflash"
    weights_file = WEIGHTS_FILE
    side_files = (MASK_EMBEDDING_FILE,)
    engine = (
        "vLLM DFlashQwen3ForCausalLM (model_type speculators, speculators_model_type dflash; checked "
        "against vllm 0.32.0, model_executor/models/qwen3_dflash.py)"
    )
    serve_hint = "vllm serve {dir}   # the verifier named in config.json is loaded as the target"

    def config(self, head: DFlashHead, meta: DrafterMeta) -> dict[str, Any]:
        args = head.args
        layer_ids = to_engine_layer_ids(args.target_layer_ids, self.name)
        draft_length = args.block_size - 1  # the only K vLLM drafts this head's block with
        return {
            "architectures": ["DFlashSpeculator"],
            "speculators_model_type": "dflash",
            "speculators_version": SPECULATORS_VERSION,
            "speculators_config": speculators_section("dflash", draft_length, meta),
            "transformer_layer_config": qwen3_fields(args.layer, args.vocab_size, args.num_layers),
            "draft_vocab_size": args.draft_vocab_size,
            "target_hidden_size": args.layer.hidden_size,
            "block_size": args.block_size,
            "mask_token_id": args.mask_token_id,
            "aux_hidden_state_layer_ids": layer_ids,
            "sample_from_anchor": False,
            "sliding_window_non_causal": True,
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, replace(meta, draft_length=draft_length), self.name, layer_ids),
        }

    def tensors(self, head: DFlashHead, target: TargetWeights) -> dict[str, torch.Tensor]:
        reduced = head.args.draft_vocab_size < head.args.vocab_size
        return {
            name: tensor
            for name, tensor in trained_state(head, DFlashHead.frozen_weights).items()
            if name != MASK_EMBEDDING and (reduced or name not in ("d2t", "t2d"))
        }

    def write_side_files(self, head: DFlashHead, out_dir: Path) -> None:
        embedding = head.mask_embedding.detach().clone()
        torch.save(
            {"mask_token_id": head.args.mask_token_id, "embedding": embedding}, out_dir / MASK_EMBEDDING_FILE
        )

    def side_tensors(self, path: Path, config: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
        """mask_embedding.pt as vLLM's `_read_mask_embedding` reads it."""
        file = path / MASK_EMBEDDING_FILE
        if not file.is_file():
            return {}
        state = torch.load(file, weights_only=True)
        if isinstance(state, dict):
            if state.get("mask_token_id", config.get("mask_token_id")) != config.get("mask_token_id"):
                raise ValueError(
                    f"{file}: mask_token_id = {state['mask_token_id']} differs from config.json's "
                    f"{config.get('mask_token_id')} (vLLM refuses it)"
                )
            state = state.get("embedding")
        if not isinstance(state, torch.Tensor):
            raise ValueError(f"{file}: holds no embedding tensor")
        return {MASK_EMBEDDING: state.reshape(-1)}

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        if MASK_EMBEDDING in tensors:
            raise ValueError(
                f"{where}: key {MASK_EMBEDDING!r} in {WEIGHTS_FILE}: vLLM drops it there and reads the mask "
                f"embedding from {MASK_EMBEDDING_FILE} only"
            )
        return tensors

    def _layer_config(self, config: dict[str, Any], where: str) -> dict[str, Any]:
        require_value(config, "speculators_model_type", ("dflash",), where)
        require_keys(
            config,
            (
                "speculators_config",
                "transformer_layer_config",
                "draft_vocab_size",
                "block_size",
                "mask_token_id",
                "aux_hidden_state_layer_ids",
            ),
            where,
        )
        for key, allowed in (
            ("sliding_window_non_causal", (True, None)),  # false: vLLM makes every layer causal
            ("sample_from_anchor", (False, None)),
            ("projector_type", ("dflash", None)),
        ):
            require_value(config, key, allowed, where)
        _check_speculative_tokens(config, where)
        layer_config = config["transformer_layer_config"]
        if not isinstance(layer_config, dict):
            raise ValueError(f"{where}: config key 'transformer_layer_config' must be an object")
        inner = f"{where} (transformer_layer_config)"
        require_value(layer_config, "use_sliding_window", (False, None), inner)
        require_value(layer_config, "is_causal", (False, None), inner)
        if any(kind != "full_attention" for kind in layer_config.get("layer_types") or []):
            raise ValueError(
                f"{inner}: config key 'layer_types' = {layer_config['layer_types']!r}: our block "
                "drafter has full-attention layers only"
            )
        return layer_config

    def expected(self, config: dict[str, Any], target: TargetWeights, where: str) -> dict[str, TensorSpec]:
        """name -> shape/dtype, as vLLM 0.32's DFlashQwen3ForCausalLM allocates them (on-disk names)."""
        layer_config = self._layer_config(config, where)
        g, num_layers = qwen3_geometry_from_fields(layer_config, f"{where} (transformer_layer_config)")
        hidden, inner, vocab = g.hidden_size, g.intermediate_size, layer_config["vocab_size"]
        draft_vocab = config["draft_vocab_size"]
        q_out, kv_out = g.num_attention_heads * g.head_dim, g.num_key_value_heads * g.head_dim
        target_hidden = config.get("target_hidden_size") or hidden
        specs = {
            "fc.weight": TensorSpec((hidden, len(config["aux_hidden_state_layer_ids"]) * target_hidden)),
            "hidden_norm.weight": TensorSpec((hidden,)),
            "norm.weight": TensorSpec((hidden,)),
            "lm_head.weight": TensorSpec((draft_vocab, hidden), optional=draft_vocab == vocab),
            "embed_tokens.weight": TensorSpec((vocab, hidden), optional=True),
            MASK_EMBEDDING: TensorSpec((hidden,), optional=True),
        }
        for i in range(num_layers):
            p = f"layers.{i}."
            specs |= {
                f"{p}input_layernorm.weight": TensorSpec((hidden,)),
                f"{p}post_attention_layernorm.weight": TensorSpec((hidden,)),
                f"{p}self_attn.q_proj.weight": TensorSpec((q_out, hidden)),
                f"{p}self_attn.k_proj.weight": TensorSpec((kv_out, hidden)),
                f"{p}self_attn.v_proj.weight": TensorSpec((kv_out, hidden)),
                f"{p}self_attn.o_proj.weight": TensorSpec((hidden, q_out)),
                f"{p}self_attn.q_norm.weight": TensorSpec((g.head_dim,)),
                f"{p}self_attn.k_norm.weight": TensorSpec((g.head_dim,)),
                f"{p}mlp.gate_proj.weight": TensorSpec((inner, hidden)),
                f"{p}mlp.up_proj.weight": TensorSpec((inner, hidden)),
                f"{p}mlp.down_proj.weight": TensorSpec((hidden, inner)),
            }
        if draft_vocab < vocab:
            specs["d2t"] = TensorSpec((draft_vocab,), torch.int64)
            specs["t2d"] = TensorSpec((vocab,), torch.bool, optional=True)
        return specs

    def load(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        target: TargetWeights,
        float_dtype: torch.dtype,
        where: str,
    ) -> nn.Module:
        layer_config = self._layer_config(config, where)
        geometry, num_layers = qwen3_geometry_from_fields(layer_config, f"{where} (transformer_layer_config)")
        if (config.get("target_hidden_size") or geometry.hidden_size) != geometry.hidden_size:
            raise ValueError(
                f"{where}: target_hidden_size={config['target_hidden_size']} differs from hidden_size="
                f"{geometry.hidden_size}; our block drafter needs its layers as wide as the target"
            )
        num_target_layers = target.config.num_hidden_layers
        args = DFlashArgs(
            layer=geometry,
            num_layers=num_layers,
            vocab_size=layer_config["vocab_size"],
            draft_vocab_size=config["draft_vocab_size"],
            target_layer_ids=from_engine_layer_ids(
                config["aux_hidden_state_layer_ids"], self.name, num_target_layers
            ),
            target_num_layers=num_target_layers,
            block_size=config["block_size"],
            mask_token_id=config["mask_token_id"],
        )
        args.check_fits(target.config)
        if "embed_tokens.weight" in tensors:
            check_matches_target(
                tensors["embed_tokens.weight"], target.embed_weight, "embed_tokens.weight", where
            )
        vocab = draft_vocab_from_tensors(tensors, args.draft_vocab_size, args.vocab_size, where)
        head = DFlashHead(args, target.embed_weight, vocab).to(float_dtype)
        ours = {name: tensor for name, tensor in tensors.items() if name != "embed_tokens.weight"}
        ours.setdefault("d2t", head.d2t)
        ours.setdefault("t2d", head.t2d)
        # What vLLM runs without them: the target's lm_head (full vocabulary), embed_tokens[mask_token_id].
        ours.setdefault("lm_head.weight", target.lm_head_weight.detach().to(float_dtype))
        ours.setdefault(MASK_EMBEDDING, target.embed_weight[args.mask_token_id].detach().to(float_dtype))
        load_trained_state(head, ours, DFlashHead.frozen_weights, where)
        return head.eval()
