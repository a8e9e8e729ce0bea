import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import data.regenerate as regenerate
from data.chat_template import generation_prompt_ids
from data.prepare import DataConfig, select_conversations
from data.regenerate import RegenerateConfig, regenerate_data, stop_tokens
from heads.target import Target, TargetConfig, legacy_tokenizer_hash


@pytest.fixture(scope="module")
def tiny_target(tiny_target_dir):
    return Target.load(TargetConfig(name=str(tiny_target_dir)))


@pytest.fixture
def two_turn_chats(tmp_path):
    path = tmp_path / "chats.jsonl"
    with open(path, "w") as f:
        for i in range(7):
            messages = [
                {"role": "user", "content": f"Question {i}: how are cats?"},
                {"role": "assistant", "content": "Recorded answer one."},
                {"role": "user", "content": f"And dogs, {i}?"},
                {"role": "assistant", "content": "Recorded answer two."},
            ]
            f.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")
    return path


def data_cfg(path, tmp_path, **regen) -> DataConfig:
    settings = {"enabled": True, "max_new_tokens": 6, "batch_size": 3} | regen
    return DataConfig(
        sources=[str(path)],
        max_length=256,
        cache_dir=str(tmp_path / "cache"),
        regenerate=RegenerateConfig(**settings),
    )


def run(cfg: DataConfig, target, **kw) -> DataConfig:
    return regenerate_data(
        cfg, lambda tally: select_conversations(cfg, tally), target, Path(cfg.cache_dir), **kw
    )


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def hf_greedy_reply(target, prompt_ids: list[int], max_new_tokens: int) -> str:
    """What HF greedy `generate` replies to one prompt, alone (no batch, no padding)."""
    ids = torch.tensor([prompt_ids])
    output = target.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop_tokens(target),
        pad_token_id=target.tokenizer.pad_token_id,
    )[0, len(prompt_ids) :].tolist()
    ended = next((i for i, token in enumerate(output) if token in stop_tokens(target)), len(output))
    return target.tokenizer.decode(output[:ended], skip_special_tokens=True).strip()


def test_every_reply_is_the_targets_own_and_later_turns_see_earlier_replies(
    tiny_target, two_turn_chats, tmp_path
):
    cfg = data_cfg(two_turn_chats, tmp_path)
    out = run(cfg, tiny_target)
    assert out.regenerate.enabled is False and out.max_conversations is None
    rows = read_jsonl(out.sources[0])
    originals = read_jsonl(two_turn_chats)
    assert [r["id"] for r in rows] == [o["id"] for o in originals]  # source order, nothing lost
    for row, original in zip(rows, originals):
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert [m["content"] for m in row["messages"] if m["role"] == "user"] == [
            m["content"] for m in original["messages"] if m["role"] == "user"
        ]
        # Each reply is HF greedy `generate`'s, alone, for the regenerated prefix before it.
        for turn in (1, 3):
            prefix = generation_prompt_ids(tiny_target.tokenizer, row["messages"][:turn])
            alone = hf_greedy_reply(tiny_target, prefix, cfg.regenerate.max_new_tokens)
            assert row["messages"][turn]["content"] == alone
            assert alone not in ("Recorded answer one.", "Recorded answer two.")
    manifest = json.loads((out_dir(out) / "manifest.json").read_text())
    assert manifest["counts"]["selected"] == manifest["counts"]["kept"] == 7
    assert manifest["counts"]["replies"] == 14
    assert manifest["counts"]["generated_tokens"] <= 14 * 6


def out_dir(cfg: DataConfig) -> Path:
    return Path(cfg.sources[0]).parent


def counting(monkeypatch) -> list[int]:
    """The indices of the conversations sent to generation, as the run goes."""
    calls: list[int] = []
    original = regenerate.regenerate_conversations

    def wrapped(target, conversations, *args, **kw):
        calls.extend(i for i, _ in conversations)
        return original(target, conversations, *args, **kw)

    monkeypatch.setattr(regenerate, "regenerate_conversations", wrapped)
    return calls


def test_a_killed_run_resumes_where_it_stopped_and_a_finished_one_is_reused(
    tiny_target, two_turn_chats, tmp_path, monkeypatch
):
    cfg = data_cfg(two_turn_chats, tmp_path)
    first = run(cfg, tiny_target)
    expected = read_jsonl(first.sources[0])
    directory = out_dir(first)
    # Kill simulation: no merge yet, the last two rows lost (one half written).
    (directory / "manifest.json").unlink()
    (directory / "conversations.jsonl").unlink()
    part = directory / "part-0.jsonl"
    lines = part.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:-2]) + lines[-2][:10])
    lost = sorted(json.loads(line)["index"] for line in lines[-2:])
    calls = counting(monkeypatch)
    again = run(cfg, tiny_target)
    assert sorted(calls) == lost  # those two again, nothing else
    assert read_jsonl(again.sources[0]) == expected
    calls.clear()
    assert run(cfg, tiny_target).sources == again.sources
    assert calls == []


def test_replies_under_the_earlier_key_are_moved_not_regenerated(
    tiny_target, two_turn_chats, tmp_path, monkeypatch
):
    """A cache written before session 20 sits under the key with the earlier tokenizer hash and
    no stop tokens: the run takes it over (resuming from its part files) instead of regenerating."""
    cfg = data_cfg(two_turn_chats, tmp_path)
    first = run(cfg, tiny_target)
    expected = read_jsonl(first.sources[0])
    directory = out_dir(first)
    manifest = json.loads((directory / "manifest.json").read_text())
    legacy = manifest["key"] | {
        "target": manifest["key"]["target"] | {"tokenizer_hash": legacy_tokenizer_hash(tiny_target.tokenizer)}
    }
    legacy.pop("stop_tokens")
    old_dir = regenerate._keyed_dir(Path(cfg.cache_dir), legacy)
    directory.rename(old_dir)
    calls = counting(monkeypatch)
    again = run(cfg, tiny_target)
    assert calls == [] and not old_dir.exists()
    assert again.sources == first.sources and read_jsonl(again.sources[0]) == expected


def test_ranks_split_the_batches_and_rank_0_merges_them(tiny_target, two_turn_chats, tmp_path):
    single = read_jsonl(run(data_cfg(two_turn_chats, tmp_path / "one"), tiny_target).sources[0])
    cfg = data_cfg(two_turn_chats, tmp_path / "two")
    with pytest.raises(RuntimeError, match="not regenerated"):  # rank 0 alone cannot merge
        run(cfg, tiny_target, rank=0, world=2)
    waits = []

    def barrier():  # rank 1 waits here while rank 0 does its share and merges
        if not waits:
            run(cfg, tiny_target, rank=0, world=2)
        waits.append(1)

    merged = run(cfg, tiny_target, rank=1, world=2, barrier=barrier)
    assert waits == [1, 1]
    assert read_jsonl(merged.sources[0]) == single


def test_turns_that_do_not_fit_are_dropped_and_counted_and_never_generated_past_max_length(
    tiny_target, two_turn_chats, tmp_path
):
    prompt = tiny_target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Question 0: how are cats?"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    # Room for the first prompt and 4 of the 6 reply tokens, not for the second prompt.
    cfg = replace(data_cfg(two_turn_chats, tmp_path), max_length=len(prompt) + 4)
    out = run(cfg, tiny_target)
    rows = read_jsonl(out.sources[0])
    assert all(len(row["messages"]) == 2 for row in rows)
    counts = json.loads((out_dir(out) / "manifest.json").read_text())["counts"]
    assert sum(counts["dropped_messages"].values()) == 7
    assert counts["generated_tokens"] == 7 * 4  # the tiny model never stops early: 4 each, not 6


def test_a_larger_selection_reuses_the_replies_of_a_smaller_one(
    tiny_target, two_turn_chats, tmp_path, monkeypatch
):
    cfg = data_cfg(two_turn_chats, tmp_path)
    full = read_jsonl(run(cfg, tiny_target).sources[0])
    small = read_jsonl(run(replace(cfg, max_conversations=3), tiny_target).sources[0])
    assert small == full[:3]
    calls = counting(monkeypatch)
    assert read_jsonl(run(replace(cfg, max_conversations=6), tiny_target).sources[0]) == full[:6]
    assert calls == []  # every reply was already there


def test_skipped_conversations_are_left_out(tiny_target, two_turn_chats, tmp_path):
    cfg = data_cfg(two_turn_chats, tmp_path)
    full = read_jsonl(run(cfg, tiny_target).sources[0])
    later = run(replace(cfg, skip_conversations=2, max_conversations=3), tiny_target)
    assert later.skip_conversations == 0  # the regenerated file holds only the selection
    assert [row["id"] for row in read_jsonl(later.sources[0])] == [row["id"] for row in full[2:5]]


def test_a_run_with_skipped_conversations_takes_over_the_replies_of_the_unskipped_run(
    tiny_target, two_turn_chats, tmp_path, monkeypatch
):
    """Conversation i after data.skip_conversations=2 is conversation 2 + i of the unskipped run:
    its finished rows are taken (id and source checked), the rest generated, and the unskipped
    run's part file, which its own run may still be writing, is left as it is."""
    cfg = data_cfg(two_turn_chats, tmp_path)
    first = run(cfg, tiny_target)
    full = read_jsonl(first.sources[0])
    part = out_dir(first) / "part-0.jsonl"
    rows = {json.loads(line)["index"]: json.loads(line) for line in part.read_text().splitlines()}
    rows[3]["id"] = "another conversation"  # not conversation 3: must not be taken
    text = "".join(json.dumps(rows[i]) + "\n" for i in range(5)) + json.dumps(rows[5])[:10]
    part.write_text(text)  # rows 5 and 6 not finished yet, row 5 half written
    calls = counting(monkeypatch)
    later = run(replace(cfg, skip_conversations=2, max_conversations=5), tiny_target)
    assert sorted(calls) == [1, 3, 4]  # conversations 3, 5 and 6
    assert read_jsonl(later.sources[0]) == full[2:7]
    assert part.read_text() == text


def test_other_settings_or_weights_regenerate_elsewhere(tiny_target, two_turn_chats, tmp_path):
    cfg = data_cfg(two_turn_chats, tmp_path)
    base = run(cfg, tiny_target).sources
    assert run(replace(cfg, regenerate=replace(cfg.regenerate, batch_size=2)), tiny_target).sources == base
    assert (
        run(replace(cfg, regenerate=replace(cfg.regenerate, max_new_tokens=4)), tiny_target).sources != base
    )


@pytest.mark.parametrize(
    "field, value",
    [("max_new_tokens", 0), ("temperature", -1.0), ("top_p", 0.0), ("batch_size", 0), ("dtype", "int8")],
)
def test_bad_settings_name_the_key(field, value):
    with pytest.raises(ValueError, match=f"data.regenerate.{field}"):
        DataConfig(regenerate=RegenerateConfig(**{field: value})).validate()


def test_the_job_trains_on_regenerated_replies(make_job, tmp_path):
    from train.run import run as run_job

    job = make_job("data.regenerate.enabled=true", "data.regenerate.max_new_tokens=4", "stages=[prepare]")
    results = run_job(job)
    manifest = json.loads((Path(results["data_dir"]) / "manifest.json").read_text())
    [source] = manifest["sources"]
    assert "/regenerated/" in source["location"] and source["location"].endswith("conversations.jsonl")
    bf16 = make_job(
        "data.regenerate.enabled=true",
        "data.regenerate.max_new_tokens=4",
        "data.regenerate.dtype=bfloat16",
        "stages=[prepare]",
    )
    [bf16_source] = json.loads((Path(run_job(bf16)["data_dir"]) / "manifest.json").read_text())["sources"]
    assert bf16_source["location"] != source["location"]  # another writer: its own cache


def test_asking_for_more_conversations_than_the_sources_hold_says_how_many_exist(
    tiny_target, two_turn_chats, tmp_path, capsys
):
    out = run(replace(data_cfg(two_turn_chats, tmp_path), max_conversations=10), tiny_target)
    printed = capsys.readouterr().out
    assert "data.max_conversations=10, but the sources" in printed and "hold only 7 usable" in printed
    assert len(read_jsonl(out.sources[0])) == 7
