"""The GPU benchmark cannot run here; its harness runs on tiny CPU tensors (--dry-run)."""

import dataclasses

import pytest
import torch

from eval import bench_decoder
from eval.bench_decoder import DRY_RUN_DECODER_SIZES
from kernels import bench, bench_tree


def test_dry_run_times_every_case_and_prints_the_table_last(capsys):
    report = bench.main(["--dry-run"])
    printed = capsys.readouterr().out
    assert printed.strip().endswith(report.splitlines()[-1].strip())  # the table comes last
    table = [line for line in report.splitlines() if " | " in line]
    assert table[0].split(" | ")[0].strip() == "op"
    rows = [line.split(" | ") for line in table[1:]]
    ops = [row[0].strip() for row in rows]
    assert ops.count("soft_kl forward") == ops.count("soft_kl forward+backward") == 1
    assert ops.count("kv_compact") == len(bench.DRY_RUN_SIZES.batches)
    tree_batches = len(bench_tree.DRY_RUN_TREE_SIZES.batches)
    assert ops.count("tree_metadata") == tree_batches
    assert ops.count("tree_verify") == tree_batches * len(bench_tree.SAMPLINGS)
    assert "decoder round" not in ops  # eval/bench_decoder.py's
    for row in rows:
        assert float(row[3]) > 0 and float(row[4]) > 0  # ms per call and floor both measured


def test_the_decoder_dry_run_times_each_tree_and_sampling():
    report = bench_decoder.main(["--dry-run"])
    rows = [line.split(" | ") for line in report.splitlines() if " | " in line][1:]
    ops = [row[0].strip() for row in rows]
    assert ops.count("decoder round") == len(DRY_RUN_DECODER_SIZES.trees) * len(bench_decoder.SAMPLINGS)
    assert all(float(row[3]) > 0 for row in rows)


def test_the_gpu_rows_compare_kernel_and_reference():
    """What only a GPU run reaches, run here with the kernels in the interpreter: each kernel
    row checks its outputs against the reference's, the decoder its tokens."""
    cpu, sizes, impls = torch.device("cpu"), bench_tree.DRY_RUN_TREE_SIZES, ["reference", "triton"]
    rows = bench_tree.metadata_rows(2, cpu, torch.float32, sizes, impls, bandwidth=1e10)
    # The timed calls compact in place: the check must start from the same caches for both.
    rows += bench._kv_compact_rows(2, cpu, torch.float32, bench.DRY_RUN_SIZES, impls, bandwidth=1e10)
    for sampling in ("greedy", "T=0.7 top-k 50 top-p 0.9"):
        rows += bench_tree.verify_rows(2, cpu, torch.bfloat16, sizes, impls, 1e10, sampling)
    one_tree = dataclasses.replace(DRY_RUN_DECODER_SIZES, new_tokens=3)
    rows += bench_decoder.decoder_rows(cpu, torch.float32, one_tree, impls, bandwidth=1e10)
    kernel_rows = [row for row in rows if row.impl == "triton"]
    assert len(kernel_rows) == len(rows) // 2
    for row in kernel_rows:
        expected = {"decoder round": "same tokens as reference", "kv_compact": "bit-identical"}.get(
            row.op, "identical"
        )
        assert expected in row.check, (row.op, row.shape, row.check)


def test_without_cuda_it_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main([])


def test_the_table_lines_up():
    rows = [
        bench.Row("soft_kl forward", "N=1", "reference", 2e-3, 1e-3, "reference"),
        bench.Row("kv_compact", "B=8", "triton", None, None, "skipped"),
    ]
    lines = bench.format_table(rows).splitlines()
    assert all(len(line) == len(lines[1]) for line in lines)  # every cell padded to its column
    assert "2.000" in lines[2] and "2.0" in lines[2].split(" | ")[5]
    assert [cell.strip() for cell in lines[3].split(" | ")[3:6]] == ["-", "-", "-"]
