import json

import pytest

from data.eval_sets import EvalPrompt, load_eval_set


def test_mt_bench_has_80_two_turn_questions_in_8_categories():
    prompts = load_eval_set("mt_bench")
    assert len(prompts) == 80
    assert all(p.task == "mt_bench" and len(p.turns) == 2 for p in prompts)
    categories = {p.category for p in prompts}
    assert categories == {
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    }
    assert len({p.id for p in prompts}) == 80


def test_humaneval_and_gsm8k():
    humaneval = load_eval_set("humaneval")
    assert len(humaneval) == 164
    assert humaneval[0] == EvalPrompt("humaneval", "HumanEval/0", "code", [humaneval[0].turns[0]])
    assert humaneval[0].turns[0].startswith("from typing import List")
    gsm8k = load_eval_set("gsm8k")
    assert len(gsm8k) == 100 and {p.category for p in gsm8k} == {"math"}
    assert all(len(p.turns) == 1 and p.turns[0] for p in gsm8k)
    assert len(load_eval_set("gsm8k", limit=7)) == 7


def test_jsonl_in_the_eval_schema(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"task": "mine", "id": 1, "category": "chat", "turns": ["hi", "bye"]}) + "\n")
    assert load_eval_set(str(path)) == [EvalPrompt("mine", "1", "chat", ["hi", "bye"])]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{bad", r":1: invalid JSON"),
        (json.dumps({"task": "t", "id": "1", "category": "c"}), r":1: missing field 'turns'"),
        (json.dumps({"task": "t", "id": "1", "category": 3, "turns": ["x"]}), r":1: field 'category' is int"),
        (json.dumps({"task": "t", "id": "1", "category": "c", "turns": []}), r":1: field 'turns' must be"),
    ],
)
def test_bad_eval_jsonl_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=f"{path}{message}"):
        load_eval_set(str(path))


def test_unknown_eval_set():
    with pytest.raises(ValueError, match="unknown eval set 'mmlu'.*gsm8k"):
        load_eval_set("mmlu")
    with pytest.raises(ValueError, match="no such file"):
        load_eval_set("missing.jsonl")
