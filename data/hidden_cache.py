"""Offline hidden states: the target runs once per row, training reads the cache.

Layout of a cache directory:
  manifest.json            identity (target, tokenizer hash, weight fingerprint, layer ids,
                           dtype, row count, longest row, sha256 of the rows' token ids), shards, bytes
  shard_00000.safetensors  rows [start, end): `layer_<id>` [sum T, H] per layer id,
                           `final` [sum T, H] (post-norm), `offsets` [rows + 1]

Shards are written to a temporary name and renamed, and the manifest lists only finished
shards, so a killed build resumes at the first missing shard.
"""

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from heads.target import Target, dtype_name

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def rows_digest(rows) -> str:
    """sha256 over every row's token ids, in order: other data (or other cuts), other cache."""
    digest = hashlib.sha256()
    for row in rows:
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        digest.update(len(ids).to_bytes(8, "little") + ids.tobytes())
    return digest.hexdigest()


def _identity(target: Target, layer_ids: Sequence[int], rows) -> dict:
    """What the cached hidden states depend on; a cache is used only when all of it matches."""
    return {
        "target": target.config.name_or_path,
        "tokenizer_hash": target.tokenizer_hash,
        "weights": target.weights_fingerprint(),
        "layer_ids": list(layer_ids),
        "dtype": dtype_name(target.dtype),
        "hidden_size": target.hidden_size,
        "rows": len(rows),
        "max_length": max((len(row["input_ids"]) for row in rows), default=0),
        "rows_sha256": rows_digest(rows),
    }


def build_hidden_cache(
    target: Target,
    rows,  # a datasets.Dataset or a list of {"input_ids": list[int], ...}
    layer_ids: Sequence[int],
    out_dir: Path,
    rows_per_shard: int = 256,
    batch_size: int = 4,
    show_progress: bool = True,
) -> dict:
    """Write (or finish writing) the cache; returns its manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    identity = _identity(target, layer_ids, rows)
    manifest_path = out_dir / MANIFEST
    manifest = {**identity, "shards": [], "bytes": 0}
    if manifest_path.is_file():
        existing = json.loads(manifest_path.read_text())
        if {k: existing.get(k) for k in identity} == identity:
            manifest = existing
        else:
            log.warning("%s was built for another target/layers/data: rebuilding", out_dir)
    done = {shard["start"] for shard in manifest["shards"]}
    starts = [s for s in range(0, len(rows), rows_per_shard) if s not in done]
    cached_rows = sum(shard["end"] - shard["start"] for shard in manifest["shards"])
    progress = tqdm(
        total=len(rows), initial=cached_rows, desc="hidden-state cache", unit="row", disable=not show_progress
    )
    for start in starts:
        end = min(start + rows_per_shard, len(rows))
        tensors = _encode_shard(target, [rows[i] for i in range(start, end)], layer_ids, batch_size, progress)
        name = f"shard_{start // rows_per_shard:05d}.safetensors"
        tmp = out_dir / (name + ".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, out_dir / name)
        manifest["shards"].append({"file": name, "start": start, "end": end})
        manifest["shards"].sort(key=lambda shard: shard["start"])
        manifest["bytes"] = sum((out_dir / s["file"]).stat().st_size for s in manifest["shards"])
        _write_json(manifest_path, manifest)
    progress.close()
    log.info("hidden-state cache %s: %d rows, %.2f GB", out_dir, len(rows), manifest["bytes"] / 1e9)
    return manifest


def _encode_shard(
    target: Target, rows: Sequence[dict], layer_ids: Sequence[int], batch_size: int, progress: tqdm
) -> dict[str, torch.Tensor]:
    """One shard's hidden states, rows in their order. Batches are formed from rows sorted by
    length, so a batch pads to rows of about its own length rather than to its longest
    neighbour in data order (conversations of 50 to 1024 tokens side by side)."""
    states: list[list[torch.Tensor] | None] = [None] * len(rows)  # per row: layer states..., final
    by_length = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    for first in range(0, len(rows), batch_size):
        batch = by_length[first : first + batch_size]
        length = max(len(rows[i]["input_ids"]) for i in batch)
        input_ids = torch.zeros((len(batch), length), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for b, i in enumerate(batch):
            input_ids[b, : len(rows[i]["input_ids"])] = torch.as_tensor(rows[i]["input_ids"])
            attention_mask[b, : len(rows[i]["input_ids"])] = 1
        out = target(input_ids.to(target.device), attention_mask.to(target.device), layer_ids)
        for b, i in enumerate(batch):
            n = len(rows[i]["input_ids"])
            states[i] = [hidden[b, :n].cpu() for hidden in (*out.hidden_states, out.final_hidden)]
        progress.update(len(batch))
    lengths = [len(row["input_ids"]) for row in rows]
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    tensors = {
        f"layer_{layer_id}": torch.cat([s[k] for s in states]).contiguous()
        for k, layer_id in enumerate(layer_ids)
    }
    tensors["final"] = torch.cat([s[-1] for s in states]).contiguous()
    tensors["offsets"] = offsets
    return tensors


def _write_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


class HiddenCache:
    """Reads rows back from a finished cache; refuses one built for another target, other
    layers, another dtype or other rows."""

    def __init__(self, cache_dir: Path, target: Target, layer_ids: Sequence[int], rows):
        manifest_path = cache_dir / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"no hidden-state cache at {cache_dir} ({MANIFEST} missing)")
        self.manifest = json.loads(manifest_path.read_text())
        expected = _identity(target, layer_ids, rows)
        for key, value in expected.items():
            if self.manifest.get(key) != value:
                raise ValueError(
                    f"{manifest_path}: cache built with {key}={self.manifest.get(key)!r}, "
                    f"this run has {key}={value!r}; rebuild it (delete the directory)"
                )
        covered = sum(s["end"] - s["start"] for s in self.manifest["shards"])
        if covered != len(rows):
            raise ValueError(f"{manifest_path}: cache is incomplete ({covered}/{len(rows)} rows)")
        self.cache_dir = cache_dir
        self.layer_ids = list(layer_ids)
        self.shards = self.manifest["shards"]

    def row(self, index: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Hidden states of row `index`: ([T, H] per layer id, final [T, H])."""
        shard = next(s for s in self.shards if s["start"] <= index < s["end"])
        with safe_open(str(self.cache_dir / shard["file"]), framework="pt") as f:
            offsets = f.get_slice("offsets")
            local = index - shard["start"]
            begin, end = (int(x) for x in offsets[local : local + 2])
            layers = [f.get_slice(f"layer_{i}")[begin:end] for i in self.layer_ids]
            return layers, f.get_slice("final")[begin:end]
