"""Conversation sources -> normalised conversations -> tokens with a loss mask, saved once.

`prepare_dataset` writes a `datasets` DatasetDict (train / validation; columns
input_ids: list[int32], loss_mask: list[int8]) and manifest.json to out_dir. The manifest
records the config, each source's sha256, the tokenizer and chat-template hashes and every
count; a rerun with the same config, sources and tokenizer loads the saved data instead of
tokenising again.
"""

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from tqdm import tqdm

from data.chat_template import ChatEncoder, TokenisedConversation, chat_template_hash
from data.conversations import Conversation, normalise_all
from data.packaged import REPO_ASSETS, repo_asset_manifest
from data.regenerate import RegenerateConfig
from data.sources import parse_source, read_source, source_fingerprint
from data.tally import Tally, report_short_selection
from heads.target import tokenizer_hash

# Bump when the saved layout or the reading or tokenisation method changes. 2: content parts
# and byte-order marks are read (they used to skip records), and skipped parts are counted.
MANIFEST_FORMAT = 2
BATCH_CONVERSATIONS = 256  # conversations tokenised per call; the fast tokenizer spreads a batch over cores


@dataclass
class DataConfig:
    # "sharegpt" (the packaged, truncated ShareGPT file), a .json/.jsonl[.gz] path, or
    # "hf:<hub name or save_to_disk dir>[:split]". Read in order, de-duplicated across all.
    sources: list[str] = field(default_factory=lambda: ["sharegpt"])
    # Stop after this many normalised, de-duplicated conversations, taken in source order
    # (None: all); a few more may then be dropped when tokenised (counted). Small values make
    # quick runs cheap, but the first records of a source are not a random sample.
    max_conversations: int | None = None
    # Leave out this many conversations at the start of that order (counted as skipped): e.g.
    # the ones a drafter trained on, so that a confidence head fitted to it afterwards learns
    # the acceptance it reaches on text it has not seen (on its training text it accepts more).
    skip_conversations: int = 0
    # Tokens per conversation; longer ones are cut (and counted). Longer keeps more of
    # long replies, but costs memory and time quadratically in attention.
    max_length: int = 2048
    # Share of conversations held out for validation (at least one when > 0). More gives a
    # steadier validation loss, less leaves more to train on.
    val_fraction: float = 0.02
    # Seed of the train / validation shuffle.
    seed: int = 0
    # Train on the first this many training rows of the shuffled split (None: all), the
    # validation rows unchanged: a data budget, e.g. epochs over less data against one pass
    # over more at the same steps, judged on the same held-out rows. The rows left out are counted.
    max_train_rows: int | None = None
    # Where default_out_dir puts prepared data (None: ~/.cache/drafter/data). Not part of
    # the content, so changing it does not invalidate prepared data.
    cache_dir: str | None = None
    # Replace the recorded replies with the target's own (data/regenerate.py) before tokenising.
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)

    def validate(self) -> None:
        if not self.sources:
            raise ValueError("data.sources is empty: name at least one source, e.g. data.sources=[sharegpt]")
        if self.max_conversations is not None and self.max_conversations < 1:
            raise ValueError(
                f"data.max_conversations={self.max_conversations}: expected a positive number or null"
            )
        if self.skip_conversations < 0:
            raise ValueError(f"data.skip_conversations={self.skip_conversations}: expected 0 or more")
        if self.max_length < 2:
            raise ValueError(f"data.max_length={self.max_length}: expected at least 2 tokens")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction}: expected a value in [0, 1)")
        if self.max_train_rows is not None and self.max_train_rows < 1:
            raise ValueError(f"data.max_train_rows={self.max_train_rows}: expected a positive number or null")
        self.regenerate.validate()

    def content_key(self) -> dict:
        """The fields that change the prepared data."""
        key = asdict(self)
        del key["cache_dir"]
        return key


@dataclass
class PreparedData:
    train: datasets.Dataset
    validation: datasets.Dataset
    manifest: dict
    out_dir: Path
    reused: bool  # loaded from an earlier, identical preparation

    def summary(self) -> str:
        manifest = self.manifest
        counts, tokens = manifest["counts"], manifest["tokens"]
        left_out = counts.get("train_rows_left_out", 0)
        lines = [
            f"data: {self.out_dir}" + (" (reused, not re-tokenised)" if self.reused else ""),
            "  sources: " + ", ".join(f"{s['spec']} ({s['location']})" for s in manifest["sources"]),
            f"  records read {counts['read']}, kept {counts['kept']} "
            f"(train {counts['train']}, validation {counts['validation']}"
            + (f", {left_out} training rows left out by data.max_train_rows" if left_out else "")
            + "), "
            f"duplicates {counts['duplicates']}, truncated to {manifest['config']['max_length']} tokens "
            f"{counts['truncated']}",
        ]
        titles = {
            "skipped": "skipped records",
            "dropped": "dropped conversations",
            "dropped_messages": "dropped messages",
            "skipped_parts": "skipped content parts",
        }
        for key, title in titles.items():
            for reason, count in sorted(counts[key].items(), key=lambda item: -item[1]):
                example = counts["examples"].get(reason, [""])[0]
                lines.append(f"  {title}: {count} {reason}" + (f" (e.g. {example})" if example else ""))
        share = tokens["assistant"] / max(tokens["total"], 1)
        lines.append(
            f"  tokens {tokens['total']:,}, assistant (trained on) {tokens['assistant']:,} ({share:.0%}); "
            f"prepared in {manifest['seconds']:.1f} s, {manifest['tokens_per_second']:,.0f} tokens/s"
        )
        return "\n".join(lines)


def data_cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else Path.home() / ".cache" / "drafter" / "data"


def default_out_dir(cfg: DataConfig, tokenizer) -> Path:
    """A cache directory per (content config, tokenizer), so runs that agree share one preparation."""
    key = json.dumps([cfg.content_key(), tokenizer_hash(tokenizer)], sort_keys=True)
    return data_cache_root(cfg) / hashlib.sha256(key.encode()).hexdigest()[:16]


def _reuse_key(manifest: dict) -> dict:
    return {name: manifest.get(name) for name in ("format", "config", "sources", "tokenizer")}


def _load_if_unchanged(out_dir: Path, expected: dict) -> PreparedData | None:
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a damaged manifest just means: prepare again
    if _reuse_key(manifest) != _reuse_key(expected):
        return None
    return PreparedData(*_load_splits(out_dir), manifest, out_dir, reused=True)


def select_conversations(cfg: DataConfig, tally: Tally) -> Iterator[Conversation]:
    """The configured conversations, normalised and de-duplicated, in source order (the skipped
    ones are counted in `tally`)."""
    raws = (raw for spec in cfg.sources for raw in read_source(parse_source(spec), tally))
    conversations = normalise_all(raws, tally)
    for conversation in islice(conversations, cfg.skip_conversations):
        tally.skip("data.skip_conversations", conversation.source)
    return islice(conversations, cfg.max_conversations)


def _batches(conversations: Iterator[Conversation], size: int) -> Iterator[list[Conversation]]:
    while batch := list(islice(conversations, size)):
        yield batch


def _to_dataset(rows: list[TokenisedConversation]) -> datasets.Dataset:
    """Arrow list columns built from flat arrays: no per-token Python objects."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(row.input_ids) for row in rows], out=offsets[1:])

    def column(arrays: list[np.ndarray], dtype) -> pa.ListArray:
        values = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    table = pa.table(
        {
            "input_ids": column([row.input_ids for row in rows], np.int32),
            "loss_mask": column([row.loss_mask for row in rows], np.int8),
        }
    )
    return datasets.Dataset(table)


def _split(rows: list[TokenisedConversation], cfg: DataConfig) -> tuple[list, list]:
    order = list(range(len(rows)))
    random.Random(cfg.seed).shuffle(order)
    n_validation = round(len(rows) * cfg.val_fraction)
    if cfg.val_fraction > 0 and len(rows) > 1:
        n_validation = min(max(n_validation, 1), len(rows) - 1)
    validation = [rows[i] for i in order[:n_validation]]
    return [rows[i] for i in order[n_validation:]], validation


def check_written_for(spec: str, tokenizer_sha256: str) -> None:
    """A shipped set of a target's own replies (data/assets/) trains a drafter for that target
    only: refuse it, by name, for a target with another tokenizer."""
    if spec not in REPO_ASSETS:
        return
    writer = repo_asset_manifest(spec)["key"]["target"]
    if writer["tokenizer_hash"] != tokenizer_sha256:
        raise ValueError(
            f"data.sources entry {spec!r} holds the replies of {writer['name']}, written for its "
            "tokenizer; this target's differs: use data=sharegpt, or data=sharegpt_regenerated for its own replies"
        )


def prepare_dataset(cfg: DataConfig, tokenizer, out_dir: Path) -> PreparedData:
    """Prepare (or reuse) the tokenised training data for `tokenizer` in out_dir."""
    if not isinstance(cfg, DataConfig):
        raise TypeError(
            f"prepare_dataset needs a DataConfig (OmegaConf.to_object(cfg.data)), got {type(cfg).__name__}"
        )
    cfg.validate()
    out_dir = Path(out_dir)
    sources = [parse_source(spec) for spec in cfg.sources]
    for spec in cfg.sources:
        check_written_for(spec, tokenizer_hash(tokenizer))
    encoder = ChatEncoder(tokenizer, max_length=cfg.max_length)
    manifest = {
        "format": MANIFEST_FORMAT,
        "config": cfg.content_key(),
        "sources": [
            {
                "spec": spec,
                "location": source.location,
                "split": source.split,
                "sha256": source_fingerprint(source),
            }
            for spec, source in zip(cfg.sources, sources)
        ],
        "tokenizer": {
            "sha256": tokenizer_hash(tokenizer),
            "chat_template_sha256": chat_template_hash(tokenizer),
        },
    }
    reused = _load_if_unchanged(out_dir, manifest)
    if reused is not None:
        return reused

    start = time.perf_counter()
    tally = Tally()
    rows: list[TokenisedConversation] = []
    total_tokens = 0
    conversations = select_conversations(cfg, tally)
    with tqdm(total=cfg.max_conversations, unit="conv", desc="tokenising", dynamic_ncols=True) as progress:
        for batch in _batches(conversations, BATCH_CONVERSATIONS):
            encoded = encoder.encode_batch(batch, tally)
            rows.extend(encoded)
            total_tokens += sum(len(row.input_ids) for row in encoded)
            progress.set_postfix(tokens=f"{total_tokens:,}", refresh=False)
            progress.update(len(batch))
    report_short_selection(cfg.max_conversations, progress.n, cfg.sources, cfg.skip_conversations)
    if not rows:
        raise ValueError(
            f"no conversation left to train on from data.sources={cfg.sources}: {tally.to_dict()}"
        )
    tally.kept = len(rows)
    train_rows, validation_rows = _split(rows, cfg)
    kept_rows = train_rows[: cfg.max_train_rows]  # None: all
    left_out, train_rows = len(train_rows) - len(kept_rows), kept_rows
    seconds = time.perf_counter() - start
    manifest.update(
        tokenizer_name=tokenizer.name_or_path,  # informative; the reuse key is the tokenizer's hash
        counts={
            **tally.to_dict(),
            "train": len(train_rows),
            "validation": len(validation_rows),
            "train_rows_left_out": left_out,  # data.max_train_rows
        },
        tokens={"total": total_tokens, "assistant": int(sum(int(row.loss_mask.sum()) for row in rows))},
        seconds=seconds,
        tokens_per_second=total_tokens / seconds,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    _save(out_dir, _to_dataset(train_rows), _to_dataset(validation_rows), manifest)
    return PreparedData(*_load_splits(out_dir), manifest, out_dir, reused=False)


def _load_splits(out_dir: Path) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, validation); no validation split on disk (data.val_fraction=0) reads as empty."""
    splits = datasets.load_from_disk(str(out_dir / "dataset"))
    train = splits["train"]
    return train, splits["validation"] if "validation" in splits else train.select([])


def _save(out_dir: Path, train: datasets.Dataset, validation: datasets.Dataset, manifest: dict) -> None:
    """Dataset first, manifest last (atomically): a half-written preparation is never reused."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    manifest_path.unlink(missing_ok=True)
    shutil.rmtree(out_dir / "dataset", ignore_errors=True)
    bars_were_enabled = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # saving takes well under a second; its bars would bury the summary
    try:
        # `datasets` cannot read back an empty split: none is written (see _load_splits).
        splits = {"train": train} | ({"validation": validation} if len(validation) else {})
        datasets.DatasetDict(splits).save_to_disk(str(out_dir / "dataset"))
    finally:
        if bars_were_enabled:
            datasets.enable_progress_bars()
    temporary = out_dir / "manifest.json.tmp"
    temporary.write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    os.replace(temporary, manifest_path)
