"""Reading a finished job back (its W&B log, the tokens it should have counted) and launching
one under `accelerate launch` with several CPU ranks, for the trainer's tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wandb_history(run_dir: Path) -> list[dict]:
    """Every logged row of the run's offline W&B log, read back with wandb's own reader."""
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [r["history"]["item"] for r in records if r["type"] == "history"]


def expected_tokens(job, world: int, steps: int) -> list[int]:
    """Non-pad tokens each optimizer step consumes, summed over ranks."""
    from datasets import load_from_disk

    from train.batches import BatchPlan

    data_dir = json.loads((Path(job.run_dir) / "results.json").read_text())["data_dir"]
    train_rows = load_from_disk(str(Path(data_dir) / "dataset"))["train"]
    plan = BatchPlan.for_rows(train_rows, job.train, world)
    return [
        sum(len(train_rows[i]["input_ids"]) for rank in range(world) for i in plan.rows(step, 0, rank))
        for step in range(steps)
    ]


def launch(job, accelerate_config: str, *overrides: str, env: dict[str, str] | None = None) -> None:
    """train/run.py on two CPU ranks under `accelerate launch --config_file conf/accelerate/<..>`,
    with the settings of a make_job() job (tiny target, prepare + train only)."""
    settings = [
        f"target.name={job.target.name}",
        "target.device=cpu",
        f"target.dtype={job.target.dtype}",
        f"data.sources=[{job.data.sources[0]}]",
        f"data.max_length={job.data.max_length}",
        "data.max_conversations=null",
        f"data.val_fraction={job.data.val_fraction}",
        f"data.cache_dir={job.data.cache_dir}",
        "head.layer_ids=[0,1,2]",
        f"head.draft_vocab_size={job.head.draft_vocab_size}",
        f"head.init={job.head.init}",
        f"train.ttt_steps={job.train.ttt_steps}",
        f"train.batch_size={job.train.batch_size}",
        f"train.max_steps={job.train.max_steps}",
        f"train.warmup_steps={job.train.warmup_steps}",
        f"train.log_every={job.train.log_every}",
        f"train.val_every={job.train.val_every}",
        f"train.checkpoint_every={job.train.checkpoint_every}",
        f"train.precision={job.train.precision}",
        f"wandb.mode={job.wandb.mode}",
        "stages=[prepare,train]",
        f"run_dir={job.run_dir}",
    ]
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "conf/accelerate" / accelerate_config),
        "--num_processes", "2", "--main_process_port", "0",
        str(ROOT / "train/run.py"), *settings, *overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
