"""Head kinds, and the on-disk form every head shares: `head_config.json` + `model.safetensors`.

`head_config.json` = {"kind": ..., "format_version": 1, "args": <the head's args dataclass>};
`model.safetensors` holds the trained tensors only: weights copied from the target and kept
frozen (the token embedding, EAGLE-1's lm_head) are passed in again at load time, never saved.
Head modules import the file helpers from here; `build_head`/`load_head` pick the class by kind.
"""

import dataclasses
import hashlib
import json
import os
import typing
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from heads.target import sha256_file

# Heads this repository ships, one directory each (README.md inside says how each was made).
RELEASE_DIR = Path(__file__).parent / "release"
CONFIG_FILE = "head_config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1


def dataclass_from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Rebuild a (nested) args dataclass; an unknown or missing key is an error naming `where`."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object for {cls.__name__}, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown {cls.__name__} keys {unknown}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}: missing {cls.__name__} key {name!r}")
            continue
        hint = hints[name]
        value = data[name]
        values[name] = (
            dataclass_from_dict(hint, value, f"{where}.{name}") if dataclasses.is_dataclass(hint) else value
        )
    return cls(**values)


def write_head(path: str | os.PathLike, kind: str, args: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Write a head directory; each file goes to a temporary name first, then is renamed."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {"kind": kind, "format_version": FORMAT_VERSION, "args": dataclasses.asdict(args)}
    tmp_config = path / (CONFIG_FILE + ".tmp")
    tmp_config.write_text(json.dumps(config, indent=2) + "\n")
    tmp_weights = path / (WEIGHTS_FILE + ".tmp")
    save_file({name: t.detach().contiguous() for name, t in tensors.items()}, str(tmp_weights))
    os.replace(tmp_weights, path / WEIGHTS_FILE)
    os.replace(tmp_config, path / CONFIG_FILE)


def head_digest(directory: str | os.PathLike) -> str:
    """sha256 over the relative names and contents of every file of a head directory: what keys
    the reuse of an eval and an export, and what an eval's verdict names the head by."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(directory)}\0{sha256_file(path)}\0".encode())
    return digest.hexdigest()


def read_head_config(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed `head_config.json` of a head directory, checked for kind and version."""
    config_path = Path(path) / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"{config_path}: not found (not a saved head directory)")
    config = json.loads(config_path.read_text())
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{config_path}: format_version={config.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    if "kind" not in config or "args" not in config:
        raise ValueError(f"{config_path}: needs the keys 'kind' and 'args'")
    return config


def read_head(path: str | os.PathLike, kind: str, args_cls: type) -> tuple[Any, dict[str, torch.Tensor]]:
    """Args and tensors of a saved head that must be of `kind`."""
    config = read_head_config(path)
    if config["kind"] != kind:
        raise ValueError(f"{Path(path) / CONFIG_FILE}: holds a {config['kind']!r} head, not {kind!r}")
    args = dataclass_from_dict(args_cls, config["args"], f"{Path(path) / CONFIG_FILE}: args")
    weights_path = Path(path) / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ValueError(f"{weights_path}: not found (the head directory has no weights)")
    return args, load_file(str(weights_path))


def load_trained_state(
    module: nn.Module, tensors: dict[str, torch.Tensor], frozen: tuple[str, ...], where: str
) -> None:
    """Load every saved tensor into `module`; a missing, extra or mis-shaped key is an error naming it."""
    expected = {name: t for name, t in module.state_dict().items() if name not in frozen}
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"{where}: missing keys {missing}, unexpected keys {extra}")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{where}: key {name!r} has shape {list(tensor.shape)}, the head expects {list(expected[name].shape)}"
            )
    module.load_state_dict(tensors, strict=False)


def trained_state(module: nn.Module, frozen: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint holds: the state dict without the frozen target weights."""
    return {name: t for name, t in module.state_dict().items() if name not in frozen}


def check_target_weight(weight: torch.Tensor, shape: tuple[int, int], name: str) -> torch.Tensor:
    """A target weight [V, H], detached (still sharing the target's storage), after a shape check."""
    if tuple(weight.shape) != shape:
        raise ValueError(
            f"{name} has shape {list(weight.shape)}, the head expects {list(shape)} (vocab_size, hidden_size)"
        )
    return weight.detach()


def _head_classes() -> dict[str, type]:
    # Imported here because the head modules import this module for their file format.
    from heads.dflash import DFlashHead
    from heads.eagle1 import Eagle1Head
    from heads.eagle3 import Eagle3Head
    from heads.medusa import MedusaHead

    return {cls.kind: cls for cls in (Eagle3Head, Eagle1Head, MedusaHead, DFlashHead)}


def head_class(kind: str) -> type:
    classes = _head_classes()
    if kind not in classes:
        raise ValueError(f"unknown head kind {kind!r} (known: {sorted(classes)})")
    return classes[kind]


def build_head(kind: str, target_config, **kwargs) -> nn.Module:
    """A fresh head of `kind` for a target; kwargs as that head's `from_target`."""
    return head_class(kind).from_target(target_config, **kwargs)


def load_head(path: str | os.PathLike, **kwargs) -> nn.Module:
    """A saved head of whatever kind the directory holds; kwargs as that head's `from_pretrained`."""
    return head_class(read_head_config(path)["kind"]).from_pretrained(path, **kwargs)
