"""The job: prepare → train → eval → export, configured by Hydra (conf/).

    accelerate launch train/run.py [group=choice ...] [key=value ...]
    python train/run.py --cfg job          # print the resolved config

Every stage reads what the previous one wrote under `run_dir`, so `stages=[eval]` on a
finished run re-evaluates its head, and a killed job rerun with the same command resumes.
"""

import json
import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

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


def run(job: JobConfig) -> dict:
    """Run the configured stages; returns what each produced (paths, summaries)."""
    from data.prepare import data_cache_root, default_out_dir, prepare_dataset, select_conversations
    from data.regenerate import regenerate_data
    from heads.target import Target
    from train.trainer import make_accelerator, train

    check_stages(job.stages)
    run_dir = Path(job.run_dir)
    accelerator = make_accelerator(job)
    if job.wandb.mode != "disabled":
        accelerator.init_trackers(
            job.wandb.project,
            config=OmegaConf.to_container(OmegaConf.structured(job)),
            init_kwargs=wandb_init_kwargs(job),
        )
    results: dict = {}
    target = Target.load(job.target)
    data_cfg = job.data
    if data_cfg.regenerate.enabled:
        data_cfg = regenerate_data(
            data_cfg,
            lambda tally: select_conversations(job.data, tally),
            target,
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
        results["head_dir"] = str(train(job, accelerator, target, prepared.train, prepared.validation))
    if accelerator.is_main_process and "eval" in job.stages:
        from eval.run import evaluate

        report = evaluate(target, run_dir / "head", job.eval, run_dir / "eval", log_fn=log_eval(accelerator))
        results["eval_report"] = str(report)
    if accelerator.is_main_process and "export" in job.stages:
        from heads.export import export_job

        results["exports"] = [str(p) for p in export_job(job, target, run_dir / "head")]
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return results


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    job: JobConfig = OmegaConf.to_object(cfg)
    run(job)


if __name__ == "__main__":
    main()
