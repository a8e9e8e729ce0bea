"""The GPU benchmark cannot run here; its harness runs on tiny CPU tensors (--dry-run)."""

import pytest
import torch

from kernels import bench


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
    for row in rows:
        assert float(row[3]) > 0 and float(row[4]) > 0  # ms per call and floor both measured


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
