"""Medusa for vLLM (`MedusaModel`) and in the Medusa reference layout.

vLLM: checked against vLLM 0.32.0 (PyPI wheel), the last release with Medusa (0.33.0 removed
it): model_executor/models/medusa.py and transformers_utils/configs/medusa.py.
  * weights `blocks.{h}.layers.{l}.weight/bias` (ResBlock: x + SiLU(W x + b)) and
    `lm_heads.{h}.weight` [V, h]; a `medusa_heads.` prefix is stripped and reference names are
    remapped on load; `token_map` only with truncated_vocab_size < vocab_size (not ours).
  * config: hidden_size, vocab_size, num_heads, num_hidden_layers (ResBlocks per head),
    truncated_vocab_size, medusa_fc_bias (vLLM's DEFAULT IS FALSE: without it the trained
    biases are silently dropped), original_lm_head (true = one lm_head shared by all heads).
    MedusaConfig.from_pretrained renames every top-level key containing "num" and "heads"
    to num_heads (and "num" + "layers" to num_hidden_layers): hence our nested "drafter" key.
  * unknown weight names are skipped by vLLM and missing ones keep their random init.

Reference (FasterDecoding/Medusa medusa/model/medusa_model.py; medusa-llm 0.1 on PyPI):
  * `medusa_lm_head.safetensors` (the repo's trainers and TGI / TensorRT-LLM read it;
    medusa-llm 0.1's loader wants the same dict as `medusa_lm_head.pt`), keys
    `{h}.{l}.linear.weight/bias` and `{h}.{num_layers}.weight`: head h is
    nn.Sequential(*([ResBlock] * num_layers), Linear(h, V, bias=False)).
  * That list repeats ONE ResBlock, so all layers of a head share weights: a head whose
    layers differ cannot be written in this layout, and we refuse instead of letting the
    reference code keep only the last layer.
  * config: medusa_num_heads, medusa_num_layers, base_model_name_or_path.
"""

from typing import Any

import torch
from torch import nn

from heads.export.card import DrafterMeta, drafter_section
from heads.export.layouts import (
    NoSideFiles,
    TargetWeights,
    TensorSpec,
    require_keys,
    require_value,
    same_bytes,
    trained_dtype_name,
)
from heads.medusa import MedusaArgs, MedusaHead
from heads.registry import WEIGHTS_FILE, load_trained_state, trained_state

REFERENCE_WEIGHTS_FILE = "medusa_lm_head.safetensors"


def _load_medusa(
    args: MedusaArgs,
    tensors: dict[str, torch.Tensor],
    target: TargetWeights,
    float_dtype: torch.dtype,
    where: str,
) -> MedusaHead:
    args.check_fits(target.config)
    head = MedusaHead(args).to(float_dtype)
    ours = dict(tensors)
    for h in range(args.num_heads):  # a bias-free checkpoint is a zero bias
        for layer in range(args.num_layers):
            ours.setdefault(
                f"blocks.{h}.layers.{layer}.bias", torch.zeros(args.hidden_size, dtype=float_dtype)
            )
    load_trained_state(head, ours, MedusaHead.frozen_weights, where)
    return head.eval()


def vllm_config_view(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as vLLM 0.32's MedusaConfig.from_pretrained renames its keys."""
    view = dict(config)
    for key in list(view):
        if "num" in key:
            if "heads" in key:
                view["num_heads"] = view.pop(key)
            elif "layers" in key:
                view["num_hidden_layers"] = view.pop(key)
    return view


class VLLMMedusa(NoSideFiles):
    name = "vllm"
    kind = "medusa"
    weights_file = WEIGHTS_FILE
    engine = (
        "vLLM MedusaModel (checked against vllm 0.32.0, model_executor/models/medusa.py; removed in 0.33.0)"
    )
    serve_hint = (
        "vllm serve {target} --speculative-config "
        '\'{{"method": "medusa", "model": "{dir}", "num_speculative_tokens": {k}}}\'   # vLLM <= 0.32'
    )

    def config(self, head: MedusaHead, meta: DrafterMeta) -> dict[str, Any]:
        args = head.args
        return {
            "architectures": ["MedusaModel"],
            "model_type": "medusa",
            "hidden_size": args.hidden_size,
            "vocab_size": args.vocab_size,
            "num_heads": args.num_heads,
            "num_hidden_layers": args.num_layers,
            "truncated_vocab_size": args.vocab_size,
            "medusa_fc_bias": True,
            "original_lm_head": False,
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, meta, self.name, None),
        }

    def tensors(self, head: MedusaHead, target: TargetWeights) -> dict[str, torch.Tensor]:
        return dict(trained_state(head, MedusaHead.frozen_weights))  # already vLLM's names

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """vLLM's load_weights: strip `medusa_heads.`, map reference names."""
        renamed = {}
        for name, tensor in tensors.items():
            name = _from_reference(name.replace("medusa_heads.", ""))
            if name in renamed:
                raise ValueError(f"{where}: two stored tensors load into {name!r}")
            renamed[name] = tensor
        return renamed

    def args(self, config: dict[str, Any], where: str) -> tuple[MedusaArgs, bool]:
        """Our args, and whether the ResBlocks have a bias."""
        view = vllm_config_view(config)
        require_keys(view, ("hidden_size", "vocab_size", "num_heads", "num_hidden_layers"), where)
        require_value(view, "original_lm_head", (False, None), where)
        if view.get("truncated_vocab_size", view["vocab_size"]) != view["vocab_size"]:
            raise ValueError(
                f"{where}: config key 'truncated_vocab_size' = {view['truncated_vocab_size']} < vocab_size: "
                "a token_map drafter is not supported"
            )
        args = MedusaArgs(
            view["hidden_size"], view["vocab_size"], view["num_heads"], view["num_hidden_layers"]
        )
        return args, bool(view.get("medusa_fc_bias", False))

    def expected(self, config: dict[str, Any], target: TargetWeights, where: str) -> dict[str, TensorSpec]:
        args, bias = self.args(config, where)
        hidden = args.hidden_size
        specs = {}
        for h in range(args.num_heads):
            for layer in range(args.num_layers):
                specs[f"blocks.{h}.layers.{layer}.weight"] = TensorSpec((hidden, hidden))
                if bias:
                    specs[f"blocks.{h}.layers.{layer}.bias"] = TensorSpec((hidden,))
            specs[f"lm_heads.{h}.weight"] = TensorSpec((args.vocab_size, hidden))
        return specs

    def load(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        target: TargetWeights,
        float_dtype: torch.dtype,
        where: str,
    ) -> nn.Module:
        return _load_medusa(self.args(config, where)[0], tensors, target, float_dtype, where)


def _from_reference(name: str) -> str:
    """`{h}.{l}.linear.{p}` -> `blocks.{h}.layers.{l}.{p}`; `{h}.{n}.weight` -> `lm_heads.{h}.weight`."""
    parts = name.split(".")
    if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return name
    head, layer, rest = parts[0], parts[1], parts[2:]
    if rest[0] == "linear":
        return f"blocks.{head}.layers.{layer}.{'.'.join(rest[1:])}"
    return f"lm_heads.{head}.{'.'.join(rest)}"


def _check_shared_layers(tensors: dict[str, torch.Tensor], args: MedusaArgs, names, where: str) -> None:
    """The reference code runs ONE ResBlock num_layers times: every layer of a head must be equal."""
    for h in range(args.num_heads):
        for param in ("weight", "bias"):
            layers = [tensors[names(h, layer, param)] for layer in range(args.num_layers)]
            if any(not same_bytes(layers[0], other) for other in layers[1:]):
                raise ValueError(
                    f"{where}: Medusa head {h} has {args.num_layers} different ResBlocks, but the reference "
                    "layout repeats one ResBlock (nn.Sequential(*([ResBlock] * medusa_num_layers))); "
                    "use the vllm layout for this head"
                )


class MedusaReference(NoSideFiles):
    name = "medusa"
    kind = "medusa"
    weights_file = REFERENCE_WEIGHTS_FILE
    engine = "the Medusa reference code (FasterDecoding/Medusa medusa/model/medusa_model.py, medusa-llm 0.1)"
    serve_hint = "python -m medusa.inference.cli --model {dir}   # base model: {target}"

    def config(self, head: MedusaHead, meta: DrafterMeta) -> dict[str, Any]:
        args = head.args
        return {
            "medusa_num_heads": args.num_heads,
            "medusa_num_layers": args.num_layers,
            "base_model_name_or_path": meta.serving_target,
            "torch_dtype": trained_dtype_name(head),
            "drafter": drafter_section(head, meta, self.name, None),
        }

    def tensors(self, head: MedusaHead, target: TargetWeights) -> dict[str, torch.Tensor]:
        args = head.args
        ours = trained_state(head, MedusaHead.frozen_weights)
        _check_shared_layers(
            ours, args, lambda h, layer, p: f"blocks.{h}.layers.{layer}.{p}", "the head to export"
        )
        tensors = {}
        for h in range(args.num_heads):
            for layer in range(args.num_layers):
                for param in ("weight", "bias"):
                    tensors[f"{h}.{layer}.linear.{param}"] = ours[f"blocks.{h}.layers.{layer}.{param}"]
            tensors[f"{h}.{args.num_layers}.weight"] = ours[f"lm_heads.{h}.weight"]
        return tensors

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        return tensors

    def args(self, config: dict[str, Any], target: TargetWeights, where: str) -> MedusaArgs:
        require_keys(config, ("medusa_num_heads", "medusa_num_layers"), where)
        target_config = target.config
        return MedusaArgs(
            target_config.hidden_size,
            target_config.vocab_size,
            config["medusa_num_heads"],
            config["medusa_num_layers"],
        )

    def expected(self, config: dict[str, Any], target: TargetWeights, where: str) -> dict[str, TensorSpec]:
        args = self.args(config, target, where)
        hidden = args.hidden_size
        specs = {}
        for h in range(args.num_heads):
            for layer in range(args.num_layers):
                specs[f"{h}.{layer}.linear.weight"] = TensorSpec((hidden, hidden))
                specs[f"{h}.{layer}.linear.bias"] = TensorSpec((hidden,))
            specs[f"{h}.{args.num_layers}.weight"] = TensorSpec((args.vocab_size, hidden))
        return specs

    def load(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        target: TargetWeights,
        float_dtype: torch.dtype,
        where: str,
    ) -> nn.Module:
        args = self.args(config, target, where)
        _check_shared_layers(tensors, args, lambda h, layer, p: f"{h}.{layer}.linear.{p}", where)
        return _load_medusa(
            args, {_from_reference(name): t for name, t in tensors.items()}, target, float_dtype, where
        )
