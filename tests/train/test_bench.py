"""train/bench.py end to end on a tiny random target, so the script cannot rot unnoticed."""

import json
import random

import pytest

from tests.helpers import tiny_llama, tiny_tokenizer
from train.bench import main

VOCAB = 128  # small enough that even bf16 autocast (slow without avx512_bf16) takes a moment


@pytest.fixture
def tiny_inputs(tmp_path) -> list[str]:
    """A 4-layer random Llama with a 128-word tokenizer, and chats written in its words."""
    target_dir = tmp_path / "target"
    tiny_llama(num_layers=4, vocab_size=VOCAB, hidden_size=32).save_pretrained(target_dir)
    tiny_tokenizer(VOCAB).save_pretrained(target_dir)
    rng = random.Random(0)

    def words() -> str:
        return " ".join(f"w{rng.randrange(100)}" for _ in range(rng.randint(6, 20)))

    chats = tmp_path / "chats.jsonl"
    with open(chats, "w") as f:
        for _ in range(12):
            messages = [{"role": "user", "content": words()}, {"role": "assistant", "content": words()}]
            f.write(json.dumps({"messages": messages}) + "\n")
    return ["--target", str(target_dir), "--source", str(chats), "--work-dir", str(tmp_path / "work")]


def test_bench_measures_every_configuration_and_prints_the_table_last(tiny_inputs, capsys):
    settings = ["--steps", "2", "--warmup", "1", "--batch-size", "2", "--max-length", "32"]
    settings += ["--draft-vocab", "64", "--ttt-steps", "2", "--chunk-tokens", "16"]
    results = main([*tiny_inputs, *settings])

    assert [(r.hidden_states, r.precision) for r in results] == [
        ("online", "fp32"),
        ("offline", "fp32"),
        ("online", "bf16"),
        ("offline", "bf16"),
    ]
    assert [r.steps for r in results] == [2, 2, 1, 1]
    for result in results:
        assert 0 < result.tokens <= result.steps * 2 * 32  # non-pad tokens only
        assert result.tokens_per_s > 0 and result.peak_rss_bytes > 2**20
    assert results[0].tokens == results[1].tokens  # online and offline read the same batches
    # Work per token is counted: offline reads the target's hidden states instead of computing them.
    assert 0 < results[1].flops_per_token < results[0].flops_per_token and results[0].gflops > 0
    printed = capsys.readouterr().out.strip().splitlines()
    table, footer = printed[-7:-1], printed[-1]
    assert "tokens/s" in table[0] and "GFLOP/s" in table[0]
    assert "matmul rate" in footer
    assert [line.split()[:2] for line in table[2:]] == [
        ["online", "fp32"],
        ["offline", "fp32"],
        ["online", "bf16"],
        ["offline", "bf16"],
    ]

    fp32_only = main([*tiny_inputs, *settings, "--skip-bf16", "--no-confidence"])
    assert [r.precision for r in fp32_only] == ["fp32", "fp32"]
    assert "confidence head off" in capsys.readouterr().out


def test_bench_rejects_meaningless_settings(tiny_inputs):
    with pytest.raises(SystemExit):
        main([*tiny_inputs, "--steps", "0"])
