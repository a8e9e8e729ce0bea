import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM

from heads.target import (
    SOURCE,
    Target,
    TargetConfig,
    check_gguf_complete,
    embedded_gguf,
    legacy_tokenizer_hash,
    resolve_model_dir,
    sha256_file,
    tokenizer_hash,
)
from tests.helpers import tiny_llama, tiny_tokenizer


def test_layer_outputs_match_hf_hidden_states_on_real_tokens():
    model = tiny_llama(num_layers=4)
    target = Target.from_pretrained_model(model, tiny_tokenizer())
    input_ids = torch.randint(0, 128, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0  # right padding
    out = target(input_ids, attention_mask, layer_ids=[3, 0, 2])
    with torch.no_grad():
        reference = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    real = attention_mask.bool()  # what padding positions hold is nobody's business
    for layer_id, hidden in zip([3, 0, 2], out.hidden_states):
        # Layer 3 is the last layer: HF's last entry is post-norm, the layer output is not.
        if layer_id < 3:
            torch.testing.assert_close(hidden[real], reference.hidden_states[layer_id + 1][real])
    torch.testing.assert_close(target.logits(out.final_hidden)[real], reference.logits[real])
    assert out.hidden_states[0].shape == (2, 9, model.config.hidden_size)


def test_padded_rows_match_unpadded_rows():
    target = Target.from_pretrained_model(tiny_llama(), tiny_tokenizer())
    row = torch.randint(0, 128, (1, 5))
    padded = torch.cat([row, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    alone = target(row, layer_ids=[1]).hidden_states[0]
    batched = target(padded, mask, layer_ids=[1]).hidden_states[0][:, :5]
    torch.testing.assert_close(alone, batched)


def test_layer_ids_out_of_range_name_the_valid_range():
    target = Target.from_pretrained_model(tiny_llama(num_layers=2), tiny_tokenizer())
    with pytest.raises(ValueError, match=r"layer ids \[2\] out of range .*valid: 0..1"):
        target(torch.zeros(1, 3, dtype=torch.long), layer_ids=[0, 2])


def test_target_is_frozen():
    target = Target.from_pretrained_model(tiny_llama(), tiny_tokenizer())
    assert not any(p.requires_grad for p in target.parameters())
    out = target(torch.zeros(1, 3, dtype=torch.long), layer_ids=[0])
    assert not out.final_hidden.requires_grad


def test_unknown_embedded_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        resolve_model_dir(TargetConfig(name="smollm9"))
    with pytest.raises(ValueError, match="unknown embedded model"):
        embedded_gguf("smollm9")


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        resolve_model_dir(TargetConfig(name=str(tmp_path / "nope.gguf")))


def write_tiny_gguf(path: Path) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((360, 16), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_truncated_gguf_says_so_with_both_sizes(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    check_gguf_complete(path)  # whole: no error
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])  # cut inside the embedding
    expected = rf"{path}: truncated: expected {len(data)} bytes, found {len(data) - 1000} "
    with pytest.raises(ValueError, match=expected):
        resolve_model_dir(TargetConfig(name=str(path), cache_dir=str(tmp_path / "cache")))
    path.write_bytes(data[:20])  # cut inside the header: the size it needs is unknown
    with pytest.raises(ValueError, match=rf"{path}: not a readable GGUF file \(20 bytes"):
        check_gguf_complete(path)


def test_bad_dtype_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="target.dtype"):
        Target.load(TargetConfig(name=str(tmp_path), dtype="float8"))


def test_tokenizer_hash_changes_with_the_chat_template():
    tokenizer = tiny_tokenizer()
    before = tokenizer_hash(tokenizer)
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    assert tokenizer_hash(tokenizer) != before


def test_a_head_recorded_with_the_earlier_tokenizer_hash_is_still_this_targets(tmp_path):
    """Heads trained before session 20 recorded `legacy_tokenizer_hash`: accepted for the same
    tokenizer, and a head of another tokenizer is still refused."""
    target = Target.from_pretrained_model(tiny_llama(), tiny_tokenizer())
    identity = target.identity() | {"tokenizer_hash": legacy_tokenizer_hash(target.tokenizer)}
    (tmp_path / "target.json").write_text(json.dumps(identity))
    target.check_head_dir(tmp_path)
    (tmp_path / "target.json").write_text(json.dumps(identity | {"tokenizer_hash": "0" * 64}))
    with pytest.raises(ValueError, match="tokenizer_hash="):
        target.check_head_dir(tmp_path)


def test_tokenizer_hash_follows_the_token_ids_not_the_special_token_names():
    """transformers 5.17 converts the embedded GGUF with another eos_token: the ids, and so the
    hash, stay; a new token, or another split of the same text, moves it."""
    tokenizer = tiny_tokenizer()
    before = tokenizer_hash(tokenizer)
    tokenizer.eos_token = "<|im_start|>"
    assert tokenizer_hash(tokenizer) == before
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split("w", behavior="isolated")
    split_differently = tokenizer_hash(tokenizer)
    assert split_differently != before
    tokenizer.add_tokens(["<tool>"])
    assert tokenizer_hash(tokenizer) not in (before, split_differently)


def test_local_model_dir_loads(tmp_path):
    model = tiny_llama()
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    target = Target.load(TargetConfig(name=str(tmp_path)))
    ids = torch.randint(0, 128, (1, 4))
    torch.testing.assert_close(
        target.logits(target(ids).final_hidden), model(ids).logits.detach(), atol=1e-5, rtol=1e-5
    )


@pytest.mark.integration
def test_embedded_target_greedy_is_the_same_from_gguf_and_from_the_cache(smollm2_cfg):
    cached = Target.load(smollm2_cfg)
    gguf, _ = embedded_gguf(smollm2_cfg.name)
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    messages = [{"role": "user", "content": "Name three primary colours."}]
    ids = cached.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    a = cached.model.generate(ids, max_new_tokens=24, do_sample=False)
    b = direct.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(a, b)
    assert cached.num_layers == 30 and cached.hidden_size == 576 and cached.vocab_size == 49152


@pytest.mark.integration
def test_corrupted_cache_is_rebuilt(smollm2_cfg, tmp_path):
    model_dir = Path(resolve_model_dir(smollm2_cfg))
    copy = tmp_path / "models" / smollm2_cfg.name
    shutil.copytree(model_dir, copy)
    weights = next(copy.glob("*.safetensors"))
    with open(weights, "r+b") as f:
        f.seek(-64, 2)
        f.write(b"\0" * 64)
    corrupted = sha256_file(weights)
    rebuilt = Path(resolve_model_dir(TargetConfig(name=smollm2_cfg.name, cache_dir=str(tmp_path))))
    assert rebuilt == copy
    recorded = json.loads((rebuilt / SOURCE).read_text())["weights"][weights.name]
    assert sha256_file(weights) == recorded != corrupted


def test_auto_dtype_is_bf16_on_a_cpu_with_native_bf16_only(monkeypatch):
    """Where a bf16 verification scores like its decode steps (AMX, or avx512_bf16 with one-row
    products widened), not where torch emulates bf16, nor on a GPU."""
    import heads.machine as machine
    import heads.target as target_module

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert target_module.resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert target_module.resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16"})
    assert target_module.resolve_dtype("auto", cpu) == torch.bfloat16
    assert target_module.resolve_dtype("auto", gpu) == torch.float32
    assert target_module.resolve_dtype("float16", cpu) == torch.float16


def test_native_bf16_follows_the_cpu_flags(monkeypatch):
    import heads.machine as machine

    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert not machine.native_bf16(torch.device("cpu"))
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx512f", "amx_bf16"})
    assert machine.native_bf16(torch.device("cpu"))
    assert isinstance(machine.cpu_flags(), set)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_asked_for_where_it_is_emulated_is_warned_of(monkeypatch, caplog, native):
    """target.dtype=bfloat16 or train.precision=bf16 on a CPU without avx512_bf16 or AMX still
    runs, emulated and slower than fp32: the job says so, naming the setting; auto and fp32 say
    nothing."""
    import heads.machine as machine
    import heads.target as target_module
    from train.run import resolve_precision

    cpu = torch.device("cpu")
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "avx512_bf16"} if native else {"avx2"})
    with caplog.at_level(logging.WARNING, logger="heads.machine"):
        assert target_module.resolve_dtype("bfloat16", cpu) == torch.bfloat16
        assert resolve_precision("bf16", cpu) == "bf16"
        target_module.resolve_dtype("auto", cpu)
        target_module.resolve_dtype("float32", cpu)
        resolve_precision("auto", cpu)
        resolve_precision("fp32", cpu)
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    if native:
        assert warned == []
    else:
        assert [message.split(" on ")[0] for message in warned] == ["target.dtype=bfloat16", "train.precision=bf16"]
        assert all("emulates" in message and "avx2" in message for message in warned)


def test_the_machine_description_names_the_features_that_decide_speed(monkeypatch):
    import heads.machine as machine

    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "fma", "avx512_bf16"})
    described = machine.describe_machine()
    assert described["simd"] == ["avx2", "avx512_bf16"]
    assert described["torch_threads"] == torch.get_num_threads()
    line = machine.machine_line(described)
    assert "avx2, avx512_bf16" in line and f"{torch.get_num_threads()} torch threads" in line


def test_ranks_starting_together_convert_a_gguf_once(tmp_path, monkeypatch):
    """The ranks of a distributed job resolve the target at the same moment: one converts, the
    others wait for it and reuse its directory (they used to write the same temporary directory
    at once, and one of them failed)."""
    import threading

    import heads.target as target_module

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    calls = []

    def slow_convert(gguf_path: Path, gguf_sha256: str, out_dir: Path) -> None:
        calls.append(out_dir)
        threading.Event().wait(0.5)  # long enough for the other rank to look at the cache
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"weights")
        weights = {"model.safetensors": sha256_file(out_dir / "model.safetensors")}
        (out_dir / SOURCE).write_text(json.dumps({"sha256": gguf_sha256, "weights": weights}))

    monkeypatch.setattr(target_module, "_convert_gguf", slow_convert)
    cfg = TargetConfig(name=str(gguf), cache_dir=str(tmp_path / "cache"))
    resolved = []
    ranks = [threading.Thread(target=lambda: resolved.append(resolve_model_dir(cfg))) for _ in range(2)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join()
    assert len(calls) == 1
    assert resolved == [str(calls[0])] * 2


def _resolve_as_rank(rank: int, name: str, cache_dir: str, init_file: str) -> None:
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    if rank == 0:
        time.sleep(5)  # rank 1 takes the lock and converts: the rank transformers would not save on
    model_dir = resolve_model_dir(TargetConfig(name=name, cache_dir=cache_dir))
    assert sorted(Path(model_dir).glob("*.safetensors")), f"rank {rank}: no weights in {model_dir}"
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_ranks_on_a_fresh_machine_both_load_the_embedded_target(smollm2_cfg, tmp_path):
    """`accelerate launch` with two ranks and an empty cache: rank 1 converts (transformers >= 5.24
    writes weights from rank 0 only while torch.distributed is up) and rank 0 waits, then reuses it."""
    import torch.multiprocessing as mp

    mp.spawn(
        _resolve_as_rank,
        args=(smollm2_cfg.name, str(tmp_path / "cache"), str(tmp_path / "init")),
        nprocs=2,
    )
    model_dir = tmp_path / "cache" / "models" / smollm2_cfg.name
    assert json.loads((model_dir / SOURCE).read_text())["weights"]
