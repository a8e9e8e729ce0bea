"""What every engine layout module provides, and the key check all of them share.

A layout turns one of our heads into an engine's `config.json` + weights file and back.
Its `expected` table is written from the engine's published layout (the names and shapes its
loader reads, computed from the config alone), never from our in-memory names, so the
reload in validate.py and the importer check a file the way the engine would read it,
except stricter: engines skip unknown keys and keep random init for missing ones (SGLang
0.5.23 and vLLM 0.32 Medusa `load_weights` both do), we name them and stop.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file
from torch import nn

from heads.draft_vocab import DraftVocab
from heads.export.card import DrafterMeta
from heads.registry import trained_state

FLOAT = None  # TensorSpec.dtype for "the checkpoint's float dtype"


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype | None = FLOAT  # None: a float dtype shared by every float tensor
    optional: bool = False  # the engine loads it when present (e.g. a copy of the target's embedding)


@dataclass(frozen=True)
class TargetWeights:
    """What a layout needs from the target: its config and the weights drafters share."""

    config: Any  # the target's HF config
    embed_weight: torch.Tensor  # [V, H]
    lm_head_weight: torch.Tensor  # [V, H]

    @classmethod
    def from_target(cls, target) -> "TargetWeights":
        """From heads.target.Target (or anything with .config, .embed_weight, .lm_head_weight)."""
        return cls(target.config, target.embed_weight, target.lm_head_weight)

    @classmethod
    def from_model(cls, model: nn.Module) -> "TargetWeights":
        """From a Hugging Face causal LM."""
        return cls(model.config, model.get_input_embeddings().weight, model.get_output_embeddings().weight)

    def for_export(self) -> "TargetWeights":
        """On the CPU in fp32: exports are written and checked there, wherever and in whatever
        dtype the target runs. A head computes in its own dtype (fp32 as trained) and a layout
        rebuilds it whole in that dtype, so a bf16 target's embedding beside the loaded head
        would round the probe's inputs unlike the rebuilt head's (the bf16 values, upcast, are
        exact)."""
        return TargetWeights(
            self.config,
            self.embed_weight.detach().cpu().float(),
            self.lm_head_weight.detach().cpu().float(),
        )


class CannotExpress(ValueError):
    """The head uses an option that this layout's engine has no setting for."""


class Layout(Protocol):
    name: str  # the export.formats name: sglang | vllm | speculators | medusa
    kind: str  # the head kind it holds: eagle3 | eagle1 | medusa | dflash
    weights_file: str
    side_files: tuple[str, ...]  # files beside weights_file that the engine opens by name (not by glob)
    engine: str  # which engine class loads it, and the code it was checked against
    serve_hint: str  # how to serve it, for the model card ({dir}, {target}, {k}, {k1} = k + 1)

    def config(self, head: nn.Module, meta: DrafterMeta) -> dict[str, Any]:
        """config.json for `head`; `meta` goes under the "drafter" key engines ignore."""
        ...

    def tensors(self, head: nn.Module, target: TargetWeights) -> dict[str, torch.Tensor]:
        """The weights file's tensors under the engine's names."""
        ...

    def engine_names(self, tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """File names as the engine's loader renames them before matching (e.g. a legacy prefix)."""
        ...

    def expected(self, config: dict[str, Any], target: TargetWeights, where: str) -> dict[str, TensorSpec]:
        """The engine's published weight table for this config (name -> shape, dtype); a config
        the engine would read differently from our heads is an error naming the key."""
        ...

    def load(
        self,
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        target: TargetWeights,
        float_dtype: torch.dtype,
        where: str,
    ) -> nn.Module:
        """Rebuild one of our heads, in `float_dtype`, from tensors checked against `expected`."""
        ...

    def write_side_files(self, head: nn.Module, out_dir: Path) -> None:
        """Write side_files for `head` (after config.json and the weights file)."""
        ...

    def side_tensors(self, path: Path, config: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
        """What the engine's loader takes from the side_files present, under its names."""
        ...


class NoSideFiles:
    """A layout whose engine reads config.json and the weights file only."""

    side_files: tuple[str, ...] = ()

    def write_side_files(self, head: nn.Module, out_dir: Path) -> None:
        pass

    def side_tensors(self, path: Path, config: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
        return {}


def read_layout(path: Path, layout: Layout, target: TargetWeights) -> nn.Module:
    """An export directory read the way its engine reads it, stricter: our head rebuilt from it."""
    where = str(path)
    config = read_config(path)
    tensors = layout.engine_names(read_tensors(path, layout.weights_file), where)
    tensors |= layout.side_tensors(path, config, where)  # engine_names refuses these names in the file
    float_dtype = check_tensors(tensors, layout.expected(config, target, where), where)
    return layout.load(config, tensors, target, float_dtype, where)


def read_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{config_path}: not found")
    config = json.loads(config_path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    return config


def read_tensors(path: Path, weights_file: str) -> dict[str, torch.Tensor]:
    weights_path = path / weights_file
    if not weights_path.is_file():
        others = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = f" (found {others}: convert them to {weights_file} first)" if others else ""
        raise ValueError(f"{weights_path}: not found{hint}")
    return load_file(str(weights_path))


def rename_prefix(
    tensors: dict[str, torch.Tensor], old: str, new: str, where: str
) -> dict[str, torch.Tensor]:
    """Names starting with `old` start with `new` instead; a name present both ways is an error."""
    renamed = {
        new + name.removeprefix(old) if name.startswith(old) else name: t for name, t in tensors.items()
    }
    if len(renamed) != len(tensors):
        both = sorted(
            name for name in tensors if name.startswith(old) and new + name.removeprefix(old) in tensors
        )
        raise ValueError(f"{where}: keys {both} are stored under both {old!r} and {new!r}")
    return renamed


def require_keys(config: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [key for key in keys if config.get(key) is None]
    if missing:
        raise ValueError(f"{where}: config.json lacks the keys {missing}")


def require_value(config: dict[str, Any], key: str, allowed: tuple, where: str) -> None:
    """config[key] (absent reads as None) must be one of `allowed`; our heads support nothing else."""
    value = config.get(key)
    if value not in allowed:
        wanted = " or ".join("absent" if v is None else json.dumps(v) for v in allowed)
        raise ValueError(
            f"{where}: config key {key!r} = {json.dumps(value)} is not supported (our heads need {wanted})"
        )


def check_tensors(
    tensors: dict[str, torch.Tensor], expected: dict[str, TensorSpec], where: str
) -> torch.dtype:
    """Missing, unexpected or mis-shaped keys are errors naming them; returns the float dtype."""
    required = {name for name, spec in expected.items() if not spec.optional}
    missing, extra = sorted(required - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"{where}: missing keys {missing}, unexpected keys {extra}")
    float_dtypes: dict[torch.dtype, list[str]] = {}
    for name, tensor in tensors.items():
        spec = expected[name]
        if tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"{where}: key {name!r} has shape {list(tensor.shape)}, the layout expects {list(spec.shape)}"
            )
        if spec.dtype is FLOAT:
            if not tensor.is_floating_point():
                raise ValueError(
                    f"{where}: key {name!r} has dtype {tensor.dtype}, the layout expects a float"
                )
            float_dtypes.setdefault(tensor.dtype, []).append(name)
        elif tensor.dtype != spec.dtype:
            raise ValueError(
                f"{where}: key {name!r} has dtype {tensor.dtype}, the layout expects {spec.dtype}"
            )
    if len(float_dtypes) != 1:
        raise ValueError(
            f"{where}: float tensors must share one dtype, got { {str(d): n[:3] for d, n in float_dtypes.items()} }"
        )
    return next(iter(float_dtypes))


def trained_dtype_name(head: nn.Module) -> str:
    """The float dtype of the head's trained tensors, as config.json's torch_dtype spells it."""
    state = trained_state(head, head.frozen_weights)
    dtype = next(t.dtype for t in state.values() if t.is_floating_point())
    return str(dtype).removeprefix("torch.")


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical dtype, shape and bytes (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(
        a.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
        b.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
    )


def check_matches_target(tensor: torch.Tensor, target_weight: torch.Tensor, name: str, where: str) -> None:
    """A drafter file may carry a copy of a target weight our heads share; it must be that weight."""
    if not same_bytes(tensor, target_weight.detach().to(tensor.dtype)):
        raise ValueError(
            f"{where}: key {name!r} differs from the target's weight; our heads share the target's "
            "(a drafter with its own copy cannot be represented)"
        )


def draft_vocab_from_tensors(
    tensors: dict[str, torch.Tensor], draft_vocab_size: int, vocab_size: int, where: str
) -> DraftVocab:
    """The map from d2t (t2d, when stored, must agree); none stored = the full vocabulary."""
    if "d2t" not in tensors:
        if draft_vocab_size != vocab_size:
            raise ValueError(
                f"{where}: missing key 'd2t' for a draft vocab of {draft_vocab_size} < {vocab_size}"
            )
        return DraftVocab.full(vocab_size)
    token_ids = torch.arange(draft_vocab_size) + tensors["d2t"]
    if (
        token_ids.min() < 0
        or token_ids.max() >= vocab_size
        or not bool((token_ids[1:] > token_ids[:-1]).all())
    ):
        raise ValueError(
            f"{where}: key 'd2t' does not map draft ids to strictly increasing target ids in [0, {vocab_size})"
        )
    vocab = DraftVocab(
        d2t=tensors["d2t"], t2d=torch.zeros(vocab_size, dtype=torch.bool), token_coverage=float("nan")
    )
    vocab.t2d[token_ids] = True
    if "t2d" in tensors and not torch.equal(tensors["t2d"], vocab.t2d):
        raise ValueError(
            f"{where}: key 't2d' disagrees with 'd2t' (t2d must mark exactly the target ids d + d2t[d])"
        )
    return vocab
