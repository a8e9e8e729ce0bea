"""Readers that turn conversation files into raw records with their provenance.

Formats: ShareGPT JSON (a top-level array, streamed record by record so that a truncated
file still yields every complete record), JSONL, and Hugging Face `datasets` (a
save_to_disk directory, or a hub name when online). A record holds either
`conversations: [{from, value}]` (ShareGPT) or `messages: [{role, content}]` (OpenAI), where
an OpenAI `content` may also be a list of parts (`[{"type": "text", "text": ...}, ...]`).
Roles are kept as written; data/conversations.py normalises them. Files may start with a
UTF-8 byte-order mark and end lines with CRLF, as Windows tools write them.
"""

import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from data.packaged import REPO_ASSETS, packaged_file
from data.tally import Tally
from heads.target import sha256_file

CHUNK_CHARS = 1 << 20  # streaming read size; a record may span any number of chunks
SCHEMAS = {"conversations": ("from", "value"), "messages": ("role", "content")}


@dataclass(frozen=True)
class RawConversation:
    source: str  # file path or dataset name
    index: int  # record index in a JSON array or dataset, line number in a JSONL file
    id: str
    turns: list[tuple[str, str]]  # (role as written, content)

    @property
    def where(self) -> str:
        return f"{self.source} record {self.index} (id {self.id})"


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # "json" | "jsonl" | "hf"
    location: str  # file path, dataset directory or hub name
    split: str = "train"  # hf only


class MalformedRecord(ValueError):
    """A record of a known schema with a bad field; the record is skipped and counted."""


def parse_source(spec: str) -> SourceSpec:
    """`sharegpt` (packaged), a name of data/packaged.py's REPO_ASSETS (e.g. `smollm2_replies`),
    a .json / .jsonl[.gz] path, or `hf:<name or dir>[:split]`."""
    if spec == "sharegpt":
        return SourceSpec("json", str(packaged_file("sharegpt")))
    if spec in REPO_ASSETS:
        return SourceSpec("jsonl", str(packaged_file(spec)))
    if spec.startswith("hf:"):
        location, _, split = spec[3:].partition(":")
        if not location:
            raise ValueError(f"data.sources entry {spec!r}: expected hf:<name or dir>[:split]")
        return SourceSpec("hf", location, split or "train")
    suffixes = Path(spec).suffixes
    suffix = suffixes[-2] if suffixes[-1:] == [".gz"] and len(suffixes) > 1 else Path(spec).suffix
    if suffix in (".json", ".jsonl"):
        return SourceSpec(suffix[1:], spec)
    raise ValueError(
        f"data.sources entry {spec!r}: expected 'sharegpt', a .json/.jsonl file or hf:<name or dir>[:split]"
    )


def read_source(source: SourceSpec, tally: Tally) -> Iterator[RawConversation]:
    readers = {"json": read_sharegpt_json, "jsonl": read_jsonl}
    if source.kind == "hf":
        return read_hf_dataset(source.location, source.split, tally)
    return readers[source.kind](Path(source.location), tally)


def source_fingerprint(source: SourceSpec) -> str:
    """sha256 of a source's bytes (a file, or every file of a dataset directory), for cache reuse."""
    path = Path(source.location)
    if path.is_file():
        return sha256_file(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(path)}\0{sha256_file(file)}\n".encode())
        return digest.hexdigest()
    if source.kind == "hf":
        return _load_hf(source.location, source.split)._fingerprint
    raise ValueError(f"{path}: no such file")


def open_text(path: Path) -> TextIO:
    """Open a UTF-8 (optionally gzip) text file, or raise a ValueError naming it.

    utf-8-sig drops a leading byte-order mark, which would otherwise hide the opening `[` of
    a JSON array and make the first JSONL line invalid JSON; universal newlines handle CRLF.
    """
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path), encoding="utf-8-sig")
        return open(path, encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror or error})") from None


@contextmanager
def _read_errors(path: Path) -> Iterator[None]:
    """Turn decoding and OS errors met while streaming `path` into a ValueError naming it."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: cannot read, not UTF-8 text ({error.reason})") from None
    except (OSError, EOFError) as error:
        raise ValueError(f"{path}: cannot read ({error})") from None


def read_sharegpt_json(path: Path, tally: Tally) -> Iterator[RawConversation]:
    """Stream a top-level JSON array record by record.

    The packaged ShareGPT file is truncated mid-record: every complete record is yielded
    and the unreadable tail is counted as skipped, instead of failing the whole file.
    """
    decoder = json.JSONDecoder()
    with open_text(path) as f, _read_errors(path):
        buffer, pos, eof = f.read(CHUNK_CHARS), 0, False
        pos = _skip_whitespace(buffer, pos)
        if buffer[pos : pos + 1] != "[":
            raise ValueError(f"{path}: unknown schema, expected a top-level JSON array of conversations")
        pos += 1
        index = 0
        while True:
            pos = _skip_whitespace(buffer, pos, ",")
            if pos < len(buffer) and buffer[pos] == "]":
                return
            if pos < len(buffer):
                try:
                    record, pos = decoder.raw_decode(buffer, pos)
                except json.JSONDecodeError as error:
                    if eof:
                        tail = len(buffer) - pos
                        tally.skip(
                            "truncated or invalid JSON tail",
                            f"{path} record {index}: {error.msg}, {tail} chars",
                        )
                        return
                else:
                    tally.read += 1
                    yield from _parse_counted(record, str(path), index, tally)
                    index += 1
                    continue
            if eof:
                tally.skip("truncated or invalid JSON tail", f"{path} after record {index - 1}: missing ']'")
                return
            more = f.read(CHUNK_CHARS)
            eof = not more
            buffer, pos = buffer[pos:] + more, 0


def _skip_whitespace(text: str, pos: int, also: str = "") -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] in also):
        pos += 1
    return pos


def read_jsonl(path: Path, tally: Tally) -> Iterator[RawConversation]:
    """One record per line; an invalid JSON line is skipped and counted with its line number."""
    with open_text(path) as f, _read_errors(path):
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                tally.skip("invalid JSON line", f"{path}:{line_number}: {error.msg}")
                continue
            tally.read += 1
            yield from _parse_counted(record, str(path), line_number, tally)


def _load_hf(location: str, split: str):
    import datasets

    try:
        if Path(location).exists():
            loaded = datasets.load_from_disk(location)
        else:
            return datasets.load_dataset(location, split=split)
    except Exception as error:  # datasets raises many kinds; the user needs the name and the cause
        raise ValueError(
            f"cannot load Hugging Face dataset {location!r} (split {split!r}): {error}"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{location}: no split {split!r}; it has {sorted(loaded)}")
        return loaded[split]
    return loaded


def read_hf_dataset(location: str, split: str, tally: Tally) -> Iterator[RawConversation]:
    dataset = _load_hf(location, split)
    for index, record in enumerate(dataset):
        tally.read += 1
        yield from _parse_counted(record, location, index, tally)


def _parse_counted(record: Any, source: str, index: int, tally: Tally) -> Iterator[RawConversation]:
    try:
        yield parse_record(record, source, index, tally)
    except MalformedRecord as error:
        tally.skip("malformed record", str(error))


def parse_record(record: Any, source: str, index: int, tally: Tally) -> RawConversation:
    """Read either schema; a record of neither schema is an error, a bad field a MalformedRecord.

    Content parts that are not text are counted in `tally` (tally.skipped_parts) once the
    record is read; a malformed record is counted as one, not by its parts.
    """
    where = f"{source} record {index}"
    schema = next((name for name in SCHEMAS if isinstance(record, dict) and name in record), None)
    if schema is None:
        fields = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(
            f"{where}: unknown schema, expected a field 'conversations' (from/value) "
            f"or 'messages' (role/content); found {fields}"
        )
    role_key, content_key = SCHEMAS[schema]
    messages = record[schema]
    if not isinstance(messages, list):
        raise MalformedRecord(f"{where}: field '{schema}' is {type(messages).__name__}, expected a list")
    turns, left_out = [], []
    for position, message in enumerate(messages):
        field_name = f"{schema}[{position}]"
        if not isinstance(message, dict):
            raise MalformedRecord(
                f"{where}: field '{field_name}' is {type(message).__name__}, expected an object"
            )
        content = message.get(content_key)
        if isinstance(content, list):
            content = _join_text_parts(content, where, f"{field_name}.{content_key}", left_out)
        for key, value in ((role_key, message.get(role_key)), (content_key, content)):
            if not isinstance(value, str):
                found = "missing" if key not in message else type(value).__name__
                raise MalformedRecord(f"{where}: field '{field_name}.{key}' is {found}, expected a string")
        turns.append((message[role_key], content))
    for reason, part_where in left_out:
        tally.skip_part(reason, part_where)
    record_id = record.get("id")
    return RawConversation(source, index, str(record_id) if record_id is not None else f"{index}", turns)


def _join_text_parts(parts: list, where: str, field_name: str, left_out: list[tuple[str, str]]) -> str:
    """The text of OpenAI content parts, joined by newlines as vLLM does before templating.

    A text drafter cannot train on other parts (image_url, input_audio, ...): each is
    appended to `left_out` as (reason, location), so a multimodal record still trains on its text.
    """
    texts = []
    for position, part in enumerate(parts):
        part_field = f"{field_name}[{position}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise MalformedRecord(
                f"{where}: field '{part_field}' is not a content part (an object with a 'type')"
            )
        if kind != "text":
            left_out.append((f"{kind!r} (only text parts are trained on)", f"{where}: field '{part_field}'"))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            found = "missing" if "text" not in part else type(part["text"]).__name__
            raise MalformedRecord(f"{where}: field '{part_field}.text' is {found}, expected a string")
    return "\n".join(texts)
