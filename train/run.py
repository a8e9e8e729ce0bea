"""The job: prepare → train → eval → export, configured by Hydra (conf/).

    accelerate launch train/run.py [group=choice ...] [key=value ...]
    python train/run.py --cfg job          # print the resolved config

Every stage reads what the previous one wrote under `run_dir`, so a killed job rerun with the
same command resumes, and a finished one reuses its eval and export while their inputs are
unchanged (train/reuse.py; `reuse=false` reruns them). The job ends with a summary
(eval/summary.py): AL and speed-up per task, the verdict, the paths, the next command.
"""

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from train import reuse
from train.config import STAGES, JobConfig, register_configs

log = logging.getLogger("drafter")
register_configs()


def wandb_init_kwargs(job: JobConfig) -> dict:
    mode = job.wandb.mode
    if mode == "auto":
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if mode not in ("online", "offline"):
        raise ValueError(f"wandb.mode={job.wandb.mode!r}; choose auto, online, offline or disabled")
    kwargs = {"mode": mode, "dir": job.run_dir, "entity": job.wandb.entity, "name": job.wandb.name}
    return {"wandb": kwargs}


def log_eval(accelerator):
    """Send the eval report's figures and plots to W&B (when a tracker is on)."""

    def log(report: dict) -> None:
        if not accelerator.trackers:
            return
        import wandb

        scalars = {
            f"eval/{task}/{key}": value
            for task, summary in report["task"].items()
            for key, value in summary.items()
            if isinstance(value, (int, float))
        }
        scalars |= {
            f"eval/overall/{k}": v for k, v in report["overall"].items() if isinstance(v, (int, float))
        }
        plots = report.get("plots", []) + ((report.get("calibration") or {}).get("images") or [])
        images = {f"eval/plots/{Path(p).stem}": wandb.Image(p) for p in plots}
        accelerator.get_tracker("wandb", unwrap=True).log(scalars | images)

    return log


def check_stages(stages: list[str]) -> None:
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"stages: unknown {unknown}; choose from {list(STAGES)}")


def resolve_precision(precision: str, device: torch.device) -> str:
    """train.precision: auto = bf16 where it runs natively, else fp32 (as data.regenerate.dtype=auto);
    bf16 asked for where it is emulated runs, with a warning."""
    from heads.machine import native_bf16, warn_if_bf16_emulated

    if precision == "auto":
        precision = "bf16" if native_bf16(device) else "fp32"
        log.info("train.precision=auto: %s on this machine", precision)
    elif precision == "bf16":
        warn_if_bf16_emulated("train.precision=bf16", device)
    return precision


def run(job: JobConfig) -> dict:
    """Run the configured stages; returns what each produced (paths, summaries)."""
    from data.prepare import data_cache_root, default_out_dir, prepare_dataset, select_conversations
    from data.regenerate import regenerate_data
    from heads.machine import native_bf16
    from heads.target import Target, dtype_name
    from train.trainer import make_accelerator, runs_on_cpu, train, whole_target_weights

    check_stages(job.stages)
    run_dir = Path(job.run_dir)
    device = torch.device("cpu" if runs_on_cpu(job) else "cuda")
    job = replace(job, train=replace(job.train, precision=resolve_precision(job.train.precision, device)))
    accelerator = make_accelerator(job)
    if job.wandb.mode != "disabled":
        accelerator.init_trackers(
            job.wandb.project,
            config=OmegaConf.to_container(OmegaConf.structured(job)),
            init_kwargs=wandb_init_kwargs(job),
        )
    results: dict = {}
    with whole_target_weights(accelerator):
        target = Target.load(job.target)
    data_cfg = job.data
    if data_cfg.regenerate.enabled:
        dtype = data_cfg.regenerate.dtype
        if dtype == "auto":
            dtype = "bfloat16" if native_bf16(target.device) else None
        with whole_target_weights(accelerator):
            writer = (
                target
                if dtype in (None, dtype_name(target.dtype))
                else Target.load(replace(job.target, dtype=dtype))
            )
        data_cfg = regenerate_data(
            data_cfg,
            lambda tally: select_conversations(job.data, tally),
            writer,
            data_cache_root(job.data),
            rank=accelerator.process_index,
            world=accelerator.num_processes,
            barrier=accelerator.wait_for_everyone,
        )
    with accelerator.main_process_first():
        prepared = prepare_dataset(data_cfg, target.tokenizer, default_out_dir(data_cfg, target.tokenizer))
    if accelerator.is_main_process and "prepare" in job.stages:
        print(prepared.summary(), flush=True)
    results["data_dir"] = str(prepared.out_dir)
    if "train" in job.stages:
        head_dir = train(job, accelerator, target, prepared.train, prepared.validation)
        if head_dir is None:  # stopped at train.stop_at_step: no head yet to evaluate or export
            accelerator.end_training()
            if accelerator.is_main_process:
                print(
                    f"train: stopped at train.stop_at_step={job.train.stop_at_step} of "
                    f"{job.train.max_steps}, checkpointed in {run_dir / 'checkpoints'}; the same "
                    "command without train.stop_at_step resumes there",
                    flush=True,
                )
            return results
        results["head_dir"] = str(head_dir)
    if accelerator.is_main_process and "eval" in job.stages:
        results["eval_report"] = eval_stage(job, target, log_eval(accelerator))
    refused = False
    if accelerator.is_main_process and "export" in job.stages:
        from heads.export.gate import GateRefused

        try:
            results["exports"], results["gate"] = export_stage(job, target)
        except GateRefused as refusal:  # a verdict, not a crash: the job ends with its summary
            log.warning("%s", refusal)
            results["exports"], results["gate"], refused = [], str(refusal), True
        except ValueError as error:
            print_summary(job, None, f"export: FAILED: {error}")
            raise
    accelerator.wait_for_everyone()
    accelerator.end_training()  # W&B prints its run summary here: ours comes after it
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
        print_summary(job, results.get("exports"), results.get("gate"), refused)
    return results


def target_inputs(job: JobConfig, target) -> dict:
    """What of the target an eval or export depends on: its settings and its weights."""
    return {**dataclasses.asdict(job.target), "weights": target.weights_fingerprint()}


def eval_stage(job: JobConfig, target, log_fn) -> str:
    """Evaluate run_dir/head into run_dir/eval, or reuse the eval there when its inputs (the head's
    files, the eval settings, the target, the prompts, the verdict's format) are unchanged.
    -> report.json's path (verdict.json beside it)."""
    from data.eval_sets import load_eval_set
    from eval import verdict
    from eval.run import evaluate
    from heads.registry import head_digest

    run_dir = Path(job.run_dir)
    head_dir, out_dir = run_dir / "head", run_dir / "eval"
    head = head_digest(head_dir)
    prompts = [dataclasses.asdict(p) for task in job.eval.tasks for p in load_eval_set(task)]
    inputs = {
        "head": head,
        "eval": dataclasses.asdict(job.eval),
        "target": target_inputs(job, target),
        "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "verdict_format": verdict.FORMAT_VERSION,  # an eval from before verdicts reruns
    }
    reused = reuse.reusable("eval", out_dir, inputs) if job.reuse else None
    if reused is not None:
        print(f"eval: reused {out_dir} (head {head[:12]}, settings unchanged)", flush=True)
        return reused[0]
    reuse.forget(out_dir)
    report = str(evaluate(target, head_dir, job.eval, out_dir, log_fn=log_fn))
    reuse.record(out_dir, inputs, [report, str(out_dir / verdict.VERDICT_FILE)])
    return report


def export_stage(job: JobConfig, target) -> tuple[list[str], str | None]:
    """Export the head as evaluated (with the temperatures the eval fitted, when it fitted them),
    or reuse the exports when the head, the verdict, the settings and the target are unchanged.
    -> (the export directories, the gate's decision in words); raises GateRefused."""
    from eval.verdict import VERDICT_FILE, read_verdict
    from heads.export import export_job
    from heads.registry import head_digest
    from heads.target import sha256_file

    run_dir = Path(job.run_dir)
    out_dir, verdict_path = run_dir / "export", run_dir / "eval" / VERDICT_FILE
    head_dir = Path(read_verdict(verdict_path).head_dir) if verdict_path.is_file() else run_dir / "head"
    head = head_digest(head_dir)
    inputs = {
        "head": head,
        "verdict": sha256_file(verdict_path) if verdict_path.is_file() else None,
        "export": dataclasses.asdict(job.export),
        "draft_length": job.eval.draft_length,
        "target": target_inputs(job, target),
    }
    reused = reuse.reusable("export", out_dir, inputs) if job.reuse else None
    if reused is not None:
        print(
            f"export: reused {', '.join(reused)} (head {head[:12]}, verdict and settings unchanged)",
            flush=True,
        )
        return reused, gate_decision(reused)
    reuse.forget(out_dir)
    exports = [str(p) for p in export_job(job, target, head_dir)]
    reuse.record(out_dir, inputs, exports)
    return exports, gate_decision(exports)


def gate_decision(exports: list[str]) -> str | None:
    """The gate's decision in words, as the exports recorded it (gate.json); None without exports."""
    from heads.export.gate import GATE_FILE, describe

    if not exports:
        return None
    return describe(json.loads((Path(exports[0]) / GATE_FILE).read_text())["gate"])


def print_summary(
    job: JobConfig, exports: list[str] | None, gate: str | None = None, refused: bool = False
) -> None:
    """The closing summary (eval/summary.py), when run_dir holds an eval report. exports: None
    when no export stage ran; gate: the gate's decision, or why the export stage stopped;
    refused: the gate refused the head (the next step then says how to get past it)."""
    from eval.run import export_command
    from eval.summary import closing_summary, next_command

    report_path = Path(job.run_dir) / "eval" / "report.json"
    if not report_path.is_file():
        return
    report = json.loads(report_path.read_text())
    step = next_command(report, exports, export_command(report, job.target.name, report_path), refused)
    print(closing_summary(report, report_path, step, exports, gate), flush=True)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    job: JobConfig = OmegaConf.to_object(cfg)
    run(job)


if __name__ == "__main__":
    main()
