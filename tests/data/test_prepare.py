import json

import numpy as np
import pytest

from data.chat_template import ChatEncoder
from data.prepare import DataConfig, default_out_dir, prepare_dataset
from heads.target import tokenizer_hash


def write_chats(path, n: int, extra_lines=()) -> None:
    lines = [
        json.dumps(
            {
                "id": f"c{i}",
                "messages": [
                    {"role": "user", "content": f"What is {i} + {i}?"},
                    {"role": "assistant", "content": f"{i} + {i} = {2 * i}."},
                ],
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join([*lines, *extra_lines]) + "\n")


@pytest.fixture
def chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    duplicate = json.dumps(
        {
            "messages": [
                {"role": "user", "content": "What is 0 + 0?"},
                {"role": "assistant", "content": "0 + 0 = 0."},
            ]
        }
    )
    no_reply = json.dumps({"conversations": [{"from": "human", "value": "hello?"}]})
    write_chats(path, 20, extra_lines=["{broken", duplicate, no_reply])
    return path


def test_prepare_writes_masked_tokens_and_a_manifest(chats, tmp_path, smollm2_tokenizer):
    cfg = DataConfig(sources=[str(chats)], max_length=512, val_fraction=0.1, seed=1)
    prepared = prepare_dataset(cfg, smollm2_tokenizer, tmp_path / "out")

    assert not prepared.reused
    assert (len(prepared.train), len(prepared.validation)) == (18, 2)
    assert prepared.train.features["input_ids"].feature.dtype == "int32"
    assert prepared.train.features["loss_mask"].feature.dtype == "int8"
    row = prepared.train[0]
    assert len(row["input_ids"]) == len(row["loss_mask"])
    masked = np.asarray(row["input_ids"])[np.asarray(row["loss_mask"]) == 1]
    reply = smollm2_tokenizer.decode(masked.tolist(), skip_special_tokens=False)
    assert reply.endswith(".<|im_end|>") and " = " in reply

    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest == prepared.manifest
    counts = manifest["counts"]
    assert (counts["read"], counts["kept"], counts["duplicates"]) == (22, 20, 1)
    assert counts["skipped"] == {"invalid JSON line": 1}
    assert counts["dropped"] == {"no assistant turn": 1}
    assert manifest["sources"][0]["sha256"] and manifest["tokenizer"]["sha256"] == tokenizer_hash(
        smollm2_tokenizer
    )
    total = sum(len(r) for r in prepared.train["input_ids"]) + sum(
        len(r) for r in prepared.validation["input_ids"]
    )
    assert manifest["tokens"]["total"] == total
    summary = prepared.summary()
    for expected in ["kept 20", "1 invalid JSON line", "1 no assistant turn", "duplicates 1", "tokens/s"]:
        assert expected in summary


def test_unchanged_rerun_reuses_and_changed_source_reprepares(
    chats, tmp_path, smollm2_tokenizer, monkeypatch
):
    cfg = DataConfig(sources=[str(chats)], max_length=512, val_fraction=0.1)
    out_dir = tmp_path / "out"
    first = prepare_dataset(cfg, smollm2_tokenizer, out_dir)

    calls = []
    original = ChatEncoder.encode_batch
    monkeypatch.setattr(ChatEncoder, "encode_batch", lambda self, *a: calls.append(1) or original(self, *a))
    second = prepare_dataset(cfg, smollm2_tokenizer, out_dir)
    assert second.reused and not calls
    assert second.train["input_ids"] == first.train["input_ids"]
    assert "reused" in second.summary()

    write_chats(chats, 5)
    third = prepare_dataset(cfg, smollm2_tokenizer, out_dir)
    assert not third.reused and calls
    assert third.manifest["counts"]["kept"] == 5

    fourth = prepare_dataset(DataConfig(sources=[str(chats)], max_length=256), smollm2_tokenizer, out_dir)
    assert not fourth.reused


def test_max_conversations_stops_early(chats, tmp_path, smollm2_tokenizer):
    cfg = DataConfig(sources=[str(chats)], max_conversations=4, val_fraction=0.25)
    prepared = prepare_dataset(cfg, smollm2_tokenizer, tmp_path / "out")
    assert (len(prepared.train), len(prepared.validation)) == (3, 1)


def test_asking_for_more_conversations_than_exist_says_how_many_exist(
    chats, tmp_path, smollm2_tokenizer, capsys
):
    cfg = DataConfig(sources=[str(chats)], max_conversations=500, val_fraction=0.25)
    prepared = prepare_dataset(cfg, smollm2_tokenizer, tmp_path / "out")
    assert "data.max_conversations=500, but the sources" in capsys.readouterr().out
    assert len(prepared.train) + len(prepared.validation) == 20  # the 20 good ones, all used


def test_skip_conversations_takes_the_ones_after_and_counts_the_skipped(chats, tmp_path, smollm2_tokenizer):
    cfg = DataConfig(sources=[str(chats)], skip_conversations=15, max_conversations=4, val_fraction=0.25)
    prepared = prepare_dataset(cfg, smollm2_tokenizer, tmp_path / "out")
    rows = [*prepared.train, *prepared.validation]
    questions = {
        smollm2_tokenizer.decode(row["input_ids"]).split("What is ")[1].split(" +")[0] for row in rows
    }
    assert questions == {"15", "16", "17", "18"}
    assert prepared.manifest["counts"]["skipped"]["data.skip_conversations"] == 15


@pytest.mark.parametrize(
    "cfg, key",
    [
        (DataConfig(sources=[]), "data.sources"),
        (DataConfig(skip_conversations=-1), "data.skip_conversations"),
        (DataConfig(max_length=1), "data.max_length"),
        (DataConfig(val_fraction=1.0), "data.val_fraction"),
        (DataConfig(max_conversations=0), "data.max_conversations"),
        (DataConfig(max_train_rows=0), "data.max_train_rows"),
    ],
)
def test_bad_config_names_the_key(cfg, key, tmp_path, smollm2_tokenizer):
    with pytest.raises(ValueError, match=key):
        prepare_dataset(cfg, smollm2_tokenizer, tmp_path)


def test_nothing_left_is_an_error(tmp_path, smollm2_tokenizer):
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(ValueError, match="no conversation left.*no assistant turn"):
        prepare_dataset(DataConfig(sources=[str(path)]), smollm2_tokenizer, tmp_path / "out")


def test_default_out_dir_depends_on_content_not_on_cache_dir_name(tmp_path, smollm2_tokenizer):
    a = default_out_dir(DataConfig(cache_dir=str(tmp_path)), smollm2_tokenizer)
    b = default_out_dir(DataConfig(cache_dir=str(tmp_path), max_length=1024), smollm2_tokenizer)
    assert a.parent == tmp_path and a != b


def test_val_fraction_zero_means_no_validation_split(chats, tmp_path, smollm2_tokenizer):
    cfg = DataConfig(sources=[str(chats)], val_fraction=0.0)
    first = prepare_dataset(cfg, smollm2_tokenizer, tmp_path / "out")
    again = prepare_dataset(cfg, smollm2_tokenizer, tmp_path / "out")
    assert (len(first.train), len(first.validation)) == (20, 0)
    assert again.reused and (len(again.train), len(again.validation)) == (20, 0)


def test_summary_reports_skipped_content_parts(tmp_path, smollm2_tokenizer):
    path = tmp_path / "parts.jsonl"
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    lines = [
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": f"Describe picture {i}."}, image]},
                {"role": "assistant", "content": [{"type": "text", "text": f"Picture {i} shows a cat."}]},
            ]
        }
        for i in range(3)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    prepared = prepare_dataset(
        DataConfig(sources=[str(path)], val_fraction=0), smollm2_tokenizer, tmp_path / "out"
    )
    assert prepared.manifest["counts"]["kept"] == 3
    assert "skipped content parts: 3 'image_url' (only text parts are trained on)" in prepared.summary()


def test_the_shipped_replies_train_only_the_target_that_wrote_them(tmp_path, smollm2_tokenizer):
    from tests.helpers import tiny_tokenizer

    with pytest.raises(ValueError, match="holds the replies of smollm2-135m-instruct"):
        prepare_dataset(DataConfig(sources=["smollm2_replies"]), tiny_tokenizer(128), tmp_path / "other")
    prepared = prepare_dataset(
        DataConfig(sources=["smollm2_replies"], max_conversations=20, max_length=256),
        smollm2_tokenizer,
        tmp_path / "ok",
    )
    assert len(prepared.train) + len(prepared.validation) == prepared.manifest["counts"]["kept"] > 15


def test_max_train_rows_keeps_the_validation_rows_and_counts_the_rows_left_out(
    chats, tmp_path, smollm2_tokenizer
):
    full = prepare_dataset(
        DataConfig(sources=[str(chats)], val_fraction=0.25), smollm2_tokenizer, tmp_path / "a"
    )
    cut = prepare_dataset(
        DataConfig(sources=[str(chats)], val_fraction=0.25, max_train_rows=6),
        smollm2_tokenizer,
        tmp_path / "b",
    )
    assert cut.validation["input_ids"] == full.validation["input_ids"]
    assert cut.train["input_ids"] == full.train["input_ids"][:6]
    assert cut.manifest["counts"]["train_rows_left_out"] == len(full.train) - 6
    assert "training rows left out by data.max_train_rows" in cut.summary()
