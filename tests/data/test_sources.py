import gzip
import json

import datasets
import pytest

import data.sources as sources
from data.packaged import packaged_file
from data.sources import parse_source, read_hf_dataset, read_jsonl, read_sharegpt_json, source_fingerprint
from data.tally import Tally


def sharegpt_record(i: int) -> dict:
    return {
        "id": f"conv{i}",
        "conversations": [
            {"from": "human", "value": f'question {i} with "quotes", ] brackets and {{braces}}'},
            {"from": "gpt", "value": f"answer {i} ✓"},
        ],
    }


def write_truncated_sharegpt(path, n_records: int, cut_chars: int) -> None:
    text = json.dumps([sharegpt_record(i) for i in range(n_records)], indent=2, ensure_ascii=False)
    path.write_text(text[:-cut_chars], encoding="utf-8")


@pytest.mark.parametrize("chunk_chars", [64, 1 << 20])  # records crossing chunks, and one chunk
def test_truncated_sharegpt_yields_every_complete_record(tmp_path, monkeypatch, chunk_chars):
    monkeypatch.setattr(sources, "CHUNK_CHARS", chunk_chars)
    path = tmp_path / "sharegpt.json"
    write_truncated_sharegpt(path, n_records=30, cut_chars=40)  # cuts into the last record
    tally = Tally()
    records = list(read_sharegpt_json(path, tally))
    assert [r.id for r in records] == [f"conv{i}" for i in range(29)]
    assert records[3].turns == [
        ("human", sharegpt_record(3)["conversations"][0]["value"]),
        ("gpt", "answer 3 ✓"),
    ]
    assert (records[3].source, records[3].index) == (str(path), 3)
    assert tally.read == 29
    assert tally.skipped == {"truncated or invalid JSON tail": 1}
    assert "record 29" in tally.examples["truncated or invalid JSON tail"][0]


def test_complete_sharegpt_has_nothing_skipped(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([sharegpt_record(i) for i in range(5)]))
    tally = Tally()
    assert len(list(read_sharegpt_json(path, tally))) == 5
    assert not tally.skipped


def test_jsonl_reads_both_schemas_and_counts_invalid_lines(tmp_path):
    path = tmp_path / "chats.jsonl"
    lines = [
        json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
        "{not json",
        "",
        json.dumps(
            {"id": 7, "conversations": [{"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]}
        ),
        json.dumps({"messages": [{"role": "user", "content": None}]}),
    ]
    path.write_text("\n".join(lines) + "\n")
    tally = Tally()
    records = list(read_jsonl(path, tally))
    assert [(r.id, r.index, r.turns) for r in records] == [
        ("1", 1, [("user", "a"), ("assistant", "b")]),
        ("7", 4, [("human", "c"), ("gpt", "d")]),
    ]
    assert tally.skipped == {"invalid JSON line": 1, "malformed record": 1}
    assert tally.examples["invalid JSON line"] == [
        f"{path}:2: Expecting property name enclosed in double quotes"
    ]
    assert "messages[0].content" in tally.examples["malformed record"][0]
    assert tally.read == 3


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "chats.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    assert parse_source(str(path)).kind == "jsonl"
    assert len(list(read_jsonl(path, Tally()))) == 1


@pytest.mark.parametrize("reader, name", [(read_jsonl, "x.jsonl"), (read_sharegpt_json, "x.json")])
def test_missing_file_is_named(tmp_path, reader, name):
    with pytest.raises(ValueError, match=f"{tmp_path / name}: no such file"):
        list(reader(tmp_path / name, Tally()))


def test_unreadable_files_are_named(tmp_path):
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    with pytest.raises(ValueError, match=f"{directory}: cannot read"):
        list(read_jsonl(directory, Tally()))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"[\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=f"{binary}: cannot read, not UTF-8"):
        list(read_sharegpt_json(binary, Tally()))


def test_unknown_schema_names_file_record_and_fields(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(ValueError, match=rf"{path} record 1: unknown schema.*'conversations'.*\['text'\]"):
        list(read_jsonl(path, Tally()))
    not_array = tmp_path / "object.json"
    not_array.write_text(json.dumps({"conversations": []}))
    with pytest.raises(ValueError, match=f"{not_array}: unknown schema, expected a top-level JSON array"):
        list(read_sharegpt_json(not_array, Tally()))


def test_hf_dataset_directory(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(3)
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))

    spec = parse_source(f"hf:{tmp_path / 'dd'}:train")
    assert (spec.kind, spec.split) == ("hf", "train")
    records = list(read_hf_dataset(spec.location, spec.split, Tally()))
    assert [r.turns[1][1] for r in records] == ["a0", "a1", "a2"]
    assert len(list(read_hf_dataset(str(tmp_path / "ds"), "train", Tally()))) == 3
    with pytest.raises(ValueError, match="no split 'test'"):
        list(read_hf_dataset(str(tmp_path / "dd"), "test", Tally()))
    assert len(source_fingerprint(spec)) == 64


def test_parse_source_rejects_unknown_kinds():
    assert parse_source("sharegpt").location == str(packaged_file("sharegpt"))
    with pytest.raises(ValueError, match="data.sources entry 'chats.csv'"):
        parse_source("chats.csv")


@pytest.mark.integration
def test_packaged_sharegpt_recovers_every_complete_conversation():
    tally = Tally()
    count = sum(1 for _ in read_sharegpt_json(packaged_file("sharegpt"), tally))
    assert count == tally.read == 17_671
    assert tally.skipped == {"truncated or invalid JSON tail": 1}


@pytest.mark.parametrize("chunk_chars", [64, 1 << 20])
def test_windows_files_with_a_byte_order_mark_and_crlf_read_like_any_other(
    tmp_path, monkeypatch, chunk_chars
):
    monkeypatch.setattr(sources, "CHUNK_CHARS", chunk_chars)
    bom = "\ufeff".encode()
    sharegpt = tmp_path / "sharegpt.json"
    text = json.dumps([sharegpt_record(i) for i in range(3)], indent=2, ensure_ascii=False)
    sharegpt.write_bytes(bom + text.replace("\n", "\r\n").encode())
    tally = Tally()
    records = list(read_sharegpt_json(sharegpt, tally))
    assert [r.id for r in records] == ["conv0", "conv1", "conv2"]
    assert records[2].turns[1] == ("gpt", "answer 2 ✓")
    assert not tally.skipped

    chats = tmp_path / "chats.jsonl.gz"
    line = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    with gzip.open(chats, "wb") as f:
        f.write(bom + f"{line}\r\n{line}\r\n".encode())
    tally = Tally()
    assert [r.turns for r in read_jsonl(chats, tally)] == [[("user", "a"), ("assistant", "b")]] * 2
    assert not tally.skipped


def parts_record(*parts: dict) -> dict:
    return {
        "messages": [
            {"role": "user", "content": list(parts)},
            {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]},
        ]
    }


def test_content_parts_join_their_text_and_count_the_other_parts(tmp_path):
    path = tmp_path / "chats.jsonl"
    text = {"type": "text", "text": "What is in"}
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    records = [
        parts_record(text, image, {"type": "text", "text": "this picture?"}),
        parts_record(image),  # nothing left to prompt with: dropped later as an empty message
        parts_record(image, {"type": "text", "text": None}),  # malformed: its image is not counted
        parts_record("just a string"),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    tally = Tally()
    read = list(read_jsonl(path, tally))
    assert [r.turns for r in read] == [
        [("user", "What is in\nthis picture?"), ("assistant", "an answer")],
        [("user", ""), ("assistant", "an answer")],
    ]
    reason = "'image_url' (only text parts are trained on)"
    assert tally.skipped_parts == {reason: 2}
    assert tally.examples[reason][0] == f"{path} record 1: field 'messages[0].content[1]'"
    assert tally.skipped == {"malformed record": 2}
    assert [e.split(": ", 1)[1] for e in tally.examples["malformed record"]] == [
        "field 'messages[0].content[1].text' is NoneType, expected a string",
        "field 'messages[0].content[0]' is not a content part (an object with a 'type')",
    ]
    assert tally.to_dict()["skipped_parts"] == {reason: 2}


def test_hf_dataset_with_content_parts(tmp_path):
    """Arrow gives every part every key (`text: None` on an image part): the type decides."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    rows = [parts_record({"type": "text", "text": f"q{i}"}, image) for i in range(2)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    tally = Tally()
    records = list(read_hf_dataset(str(tmp_path / "ds"), "train", tally))
    assert [r.turns[0] for r in records] == [("user", "q0"), ("user", "q1")]
    assert sum(tally.skipped_parts.values()) == 2 and not tally.skipped
