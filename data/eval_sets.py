"""Evaluation prompt sets in one schema: MT-bench, HumanEval, GSM8K, or any JSONL of EvalPrompt.

Every loader validates its file and names the file, line and field of a bad record, so a
broken eval set fails before any model is loaded.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.packaged import packaged_file
from data.sources import open_text


@dataclass
class EvalPrompt:
    task: str  # the eval set: mt_bench | humaneval | gsm8k | a user's name
    id: str
    category: str  # reported separately (MT-bench's 8 categories, "code", "math")
    turns: list[str]  # user turns; the model's reply to each is generated before the next


def _records(path: Path) -> Iterator[tuple[str, dict]]:
    """(location, record) per non-blank line; invalid JSON is an error: an eval set must be whole."""
    with open_text(path) as f:
        try:
            lines = list(f)
        except (UnicodeDecodeError, OSError, EOFError) as error:
            raise ValueError(f"{path}: cannot read ({error})") from None
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: invalid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, found {type(record).__name__}")
        yield where, record


def _field(record: dict, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in record:
        raise ValueError(f"{where}: missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind):
        expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{where}: field {name!r} is {type(value).__name__}, expected {expected}")
    return value


def _turns(value: list, where: str) -> list[str]:
    if not value or not all(isinstance(turn, str) and turn.strip() for turn in value):
        raise ValueError(f"{where}: field 'turns' must be a non-empty list of non-empty strings")
    return value


def load_mt_bench() -> list[EvalPrompt]:
    return [
        EvalPrompt(
            "mt_bench",
            str(_field(record, "question_id", (int, str), where)),
            _field(record, "category", str, where),
            _turns(_field(record, "turns", list, where), where),
        )
        for where, record in _records(packaged_file("mt_bench"))
    ]


def load_humaneval() -> list[EvalPrompt]:
    return [
        EvalPrompt(
            "humaneval", _field(record, "task_id", str, where), "code", [_field(record, "prompt", str, where)]
        )
        for where, record in _records(packaged_file("humaneval"))
    ]


def load_gsm8k() -> list[EvalPrompt]:
    return [
        EvalPrompt("gsm8k", _field(record, "id", str, where), "math", [_field(record, "prompt", str, where)])
        for where, record in _records(packaged_file("gsm8k"))
    ]


def load_eval_jsonl(path: Path) -> list[EvalPrompt]:
    """A JSONL file with one EvalPrompt per line: {task, id, category, turns}."""
    prompts = []
    for where, record in _records(path):
        prompts.append(
            EvalPrompt(
                _field(record, "task", str, where),
                str(_field(record, "id", (str, int), where)),
                _field(record, "category", str, where),
                _turns(_field(record, "turns", list, where), where),
            )
        )
    return prompts


EVAL_SETS: dict[str, Callable[[], list[EvalPrompt]]] = {
    "mt_bench": load_mt_bench,
    "humaneval": load_humaneval,
    "gsm8k": load_gsm8k,
}


def load_eval_set(name_or_path: str, limit: int | None = None) -> list[EvalPrompt]:
    """A packaged set by name, or a JSONL file in the EvalPrompt schema; the first `limit` prompts."""
    if limit is not None and limit < 1:
        raise ValueError(f"eval set limit={limit}: expected a positive number or None")
    if name_or_path in EVAL_SETS:
        prompts = EVAL_SETS[name_or_path]()
    elif Path(name_or_path).suffix in (".jsonl", ".gz") or Path(name_or_path).exists():
        prompts = load_eval_jsonl(Path(name_or_path))
    else:
        raise ValueError(
            f"unknown eval set {name_or_path!r}: expected one of {sorted(EVAL_SETS)} or a .jsonl path"
        )
    if not prompts:
        raise ValueError(f"eval set {name_or_path!r} has no prompts")
    return prompts[:limit]
