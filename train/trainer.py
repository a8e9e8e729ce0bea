"""The training loop: distil a frozen target's hidden states into a draft head.

One loop for every head kind and every launcher (one CPU, DDP, DeepSpeed, FSDP through
accelerate). Per step: features (online target forward, or the offline cache) → head
objective → backward → clip → step. Metrics stay on the device and are read once per
`log_every` steps, then logged for every step in between.
"""

import copy
import json
import logging
import math
import os
import resource
import shutil
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from data.hidden_cache import HiddenCache, build_hidden_cache
from heads.target import Target
from train.batches import BatchPlan, pad_rows
from train.checkpoint import TrainerState, find_resume_dir, load_checkpoint, save_checkpoint
from train.confidence import calibrate_on_batches
from train.config import JobConfig
from train.objectives import Features, Objective, build_objective

log = logging.getLogger(__name__)

VAL_METRICS = "val_metrics.jsonl"  # in run_dir: one line per validation
SNAPSHOTS = "snapshots"  # in run_dir: step-<N>/ heads every train.snapshot_every steps


LR_SCHEDULES = {  # the lr factor after warm-up, at progress 0 -> 1 through the remaining steps
    "cosine": lambda progress: 0.5 * (1 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1 - progress,
    "constant": lambda progress: 1.0,
}


def lr_schedule(optimizer: torch.optim.Optimizer, schedule: str, warmup: int, total: int):
    """A linear warm-up over `warmup` steps, then `schedule` until step `total`."""
    after_warmup = LR_SCHEDULES[schedule]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return after_warmup(min(1.0, (step - warmup) / max(1, total - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class FeatureSource:
    """Hidden states for a batch of rows: from the target now, or from the offline cache."""

    def __init__(self, target: Target, layer_ids: list[int], cache: HiddenCache | None):
        self.target, self.layer_ids, self.cache = target, layer_ids, cache

    def __call__(self, rows: list[int], batch: dict[str, torch.Tensor]) -> Features:
        device = self.target.device
        batch = {k: v.to(device) for k, v in batch.items()}
        if self.cache is None:
            out = self.target(batch["input_ids"], batch["attention_mask"], self.layer_ids)
            hidden_states, final_hidden = out.hidden_states, out.final_hidden
        else:
            hidden_states, final_hidden = self._from_cache(rows, batch["input_ids"].shape[1])
        return Features(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            loss_mask=batch["loss_mask"],
            hidden_states=hidden_states,
            final_hidden=final_hidden,
        )

    def _from_cache(self, rows: list[int], length: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        per_row = [self.cache.row(i) for i in rows]
        hidden = self.target.hidden_size

        def stack(parts: list[torch.Tensor]) -> torch.Tensor:  # [B, length, H], zero-padded
            out = torch.zeros(len(parts), length, hidden, dtype=parts[0].dtype)
            for i, part in enumerate(parts):
                out[i, : part.shape[0]] = part
            return out.to(self.target.device)

        layers = [stack([layers[k] for layers, _ in per_row]) for k in range(len(self.layer_ids))]
        return layers, stack([final for _, final in per_row])


def runs_on_cpu(job: JobConfig) -> bool:
    """The job trains on the CPU: no GPU here, or target.device=cpu."""
    return not torch.cuda.is_available() or job.target.device == "cpu"


def make_accelerator(job: JobConfig) -> Accelerator:
    from accelerate.utils import InitProcessGroupKwargs

    on_cpu = runs_on_cpu(job)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    # accelerate drops DeepSpeed without a word when cpu=True; DeepSpeed's own CPU accelerator
    # then places everything on the CPU.
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    # gloo on CPU ranks: without it DeepSpeed ranks each believe they are rank 0 of 1.
    handlers = [InitProcessGroupKwargs(backend="gloo")] if on_cpu and launched else []
    return Accelerator(
        cpu=on_cpu and not deepspeed,
        mixed_precision="bf16" if job.train.precision == "bf16" else "no",
        gradient_accumulation_steps=job.train.grad_accum,
        log_with="wandb" if job.wandb.mode != "disabled" else None,
        project_dir=job.run_dir,
        kwargs_handlers=handlers,
    )


def fill_deepspeed_config(accelerator: Accelerator, cfg) -> None:
    """The DeepSpeed "auto" values accelerate fills only from a dataloader, which we don't
    pass it (rows come from BatchPlan), from train.* instead; a number set in the file wins."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    config = plugin.deepspeed_config
    offload = (config.get("zero_optimization", {}).get("offload_optimizer") or {}).get("device", "none")
    if offload != "none":
        # Measured with deepspeed 0.19.8: the offloaded torch AdamW saves its step count as an int,
        # which never advances after a resume, so a resumed run's weights drift from an
        # uninterrupted one's.
        raise ValueError(
            f"DeepSpeed config: zero_optimization.offload_optimizer.device={offload!r} with our torch "
            "AdamW resumes to wrong weights (Adam's step count stops advancing); remove "
            "offload_optimizer (a drafter head's optimizer state is small)"
        )
    for key, value in (
        ("train_micro_batch_size_per_gpu", cfg.batch_size),
        ("gradient_clipping", cfg.grad_clip),
    ):
        if config.get(key, "auto") == "auto":
            config[key] = value


def train(
    job: JobConfig,
    accelerator: Accelerator,
    target: Target,
    train_rows,
    val_rows,
    objective: Objective | None = None,
) -> Path | None:
    """Train the head described by job.head; returns the directory of the saved head, or None
    when the run stopped at train.stop_at_step (checkpointed, to be resumed)."""
    cfg = job.train
    check_train_config(cfg)
    run = setup(job, accelerator, target, train_rows, val_rows, objective)
    state = resume(run)
    build_features(run)
    if len(val_rows) and state.step == 0:  # where training starts: a trained start's baseline
        validation(run, state)
    last_step = cfg.stop_at_step or cfg.max_steps
    window = MetricWindow(run, state)
    while state.step < last_step:
        window.append(train_step(run, state))
        state.step += 1
        if state.step % cfg.log_every == 0 or state.step == last_step:
            window.flush(state)
        if len(val_rows) and (state.step % cfg.val_every == 0 or state.step == cfg.max_steps):
            validation(run, state)
        if state.step % cfg.checkpoint_every == 0 or state.step == last_step:
            save_checkpoint(accelerator, run.run_dir / "checkpoints", state)
        if cfg.snapshot_every and state.step % cfg.snapshot_every == 0:
            snapshot(run, state.step)
    window.close(state)
    if state.step < cfg.max_steps:  # stopped at train.stop_at_step
        return None
    return finish(run, state)


@dataclass
class Run:
    """Everything the loop's steps share, built once by `setup` (features by `build_features`)."""

    job: JobConfig
    accelerator: Accelerator
    target: Target
    train_rows: Any
    val_rows: Any
    model: torch.nn.Module  # the objective as accelerate prepared it (wrapped under DDP / DeepSpeed)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    params: list[torch.Tensor]  # the trained ones
    whole: Objective | None  # ZeRO-3: a whole copy of the objective to gather the trained weights into
    layer_ids: list[int]
    head_args: dict
    autocast: AbstractContextManager
    plan: BatchPlan
    features: FeatureSource | None = None
    val_features: FeatureSource | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.job.run_dir)

    @property
    def pad_id(self) -> int:
        return self.target.tokenizer.pad_token_id


def check_train_config(cfg) -> None:
    """Refuse train.* values the loop cannot honour, before anything is built."""
    if cfg.hidden_states not in ("online", "offline"):
        raise ValueError(f"train.hidden_states={cfg.hidden_states!r}; choose online or offline")
    if cfg.precision not in ("fp32", "bf16"):  # auto is resolved by train/run.py, before this
        raise ValueError(f"train.precision={cfg.precision!r}; choose fp32, bf16 or auto")
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"train.lr_schedule={cfg.lr_schedule!r}; choose one of {sorted(LR_SCHEDULES)}")
    if cfg.snapshot_every < 0:
        raise ValueError(f"train.snapshot_every={cfg.snapshot_every}: expected 0 (never) or a step count")
    if not 0 <= cfg.stop_at_step <= cfg.max_steps:
        raise ValueError(f"train.stop_at_step={cfg.stop_at_step}: expected 0 (never) up to train.max_steps")


def setup(job: JobConfig, accelerator: Accelerator, target: Target, train_rows, val_rows, objective) -> Run:
    """Seed, build the objective (unless given), its optimizer and schedule, and hand them to accelerate."""
    cfg = job.train
    torch.manual_seed(cfg.seed)
    objective = objective or build_objective(job.head, target, train_rows, cfg)
    params = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = lr_schedule(optimizer, cfg.lr_schedule, cfg.warmup_steps, cfg.max_steps)
    layer_ids, head_args = objective.layer_ids, objective.head_args()
    fill_deepspeed_config(accelerator, cfg)
    # ZeRO-3 partitions the module's own parameters in place: keep a whole copy to save into.
    whole = copy.deepcopy(objective) if zero3(accelerator) else None
    model, optimizer = accelerator.prepare(objective, optimizer)
    if whole is not None:
        from deepspeed.runtime.zero import register_external_parameter

        # The losses read weights outside their modules' forwards (lm_head.weight in the fused
        # KL, the confidence head's L2): ZeRO-3 must gather them for the whole objective's
        # forward and backward, not only around their own module's.
        for param in objective.parameters():
            register_external_parameter(objective, param)
    accelerator.register_for_checkpointing(scheduler)
    autocast = (
        torch.autocast(accelerator.device.type, dtype=torch.bfloat16)
        if cfg.precision == "bf16"
        else nullcontext()
    )
    plan = BatchPlan.for_rows(train_rows, cfg, accelerator.num_processes)
    return Run(
        job, accelerator, target, train_rows, val_rows, model, optimizer, scheduler, params, whole,
        layer_ids, head_args, autocast, plan,
    )  # fmt: skip


def resume(run: Run) -> TrainerState:
    """The state to start from: the latest (or named) checkpoint's, else step 0. Validations
    recorded after it are dropped: the resumed run redoes them."""
    job, accelerator = run.job, run.accelerator
    state = TrainerState(0, 0, 0, job.head.kind, run.head_args, asdict(job))
    resume_dir = find_resume_dir(job.train.resume, run.run_dir / "checkpoints")
    if resume_dir is not None:
        restored = load_checkpoint(accelerator, resume_dir, job.head.kind)
        _warn_overrides(restored.config, state.config)
        state.step, state.tokens, state.bad_steps = restored.step, restored.tokens, restored.bad_steps
    if accelerator.is_main_process:
        keep_validations_up_to(run.run_dir / VAL_METRICS, state.step)
    return state


def build_features(run: Run) -> None:
    """Where hidden states come from: the target online, or the offline cache (rank 0 builds it,
    the others wait and read it). Validation always runs the target: the cache holds train rows."""
    cache = None
    if run.job.train.hidden_states == "offline":
        cache_dir = run.run_dir / "hidden_cache"
        with run.accelerator.main_process_first():
            if run.accelerator.is_main_process:
                build_hidden_cache(run.target, run.train_rows, run.layer_ids, cache_dir)
        cache = HiddenCache(cache_dir, run.target, run.layer_ids, run.train_rows)
    run.features = FeatureSource(run.target, run.layer_ids, cache)
    run.val_features = FeatureSource(run.target, run.layer_ids, None)


def train_step(run: Run, state: TrainerState) -> dict[str, torch.Tensor]:
    """One optimizer step over train.grad_accum micro-batches -> its metrics, still on the device."""
    cfg, accelerator, model = run.job.train, run.accelerator, run.model
    model.train()
    accelerator.step = 0  # micro-batch counter of accelerate's accumulate(): one optimizer step
    step_tokens = torch.zeros((), device=accelerator.device)
    step_metrics: dict[str, torch.Tensor] = {}
    grad_norm = None
    for micro in range(cfg.grad_accum):
        rows = run.plan.rows(state.step, micro, accelerator.process_index)
        batch = pad_rows([run.train_rows[i] for i in rows], run.pad_id)
        with accelerator.accumulate(model):
            feats = run.features(rows, batch)
            with run.autocast:
                loss, metrics = model(feats)
            accelerator.backward(loss)
            step_tokens += feats.attention_mask.sum()
            for k, v in metrics.items():
                step_metrics[k] = step_metrics.get(k, 0) + v.detach().float() / cfg.grad_accum
            if accelerator.sync_gradients:
                grad_norm = accelerator.clip_grad_norm_(run.params, cfg.grad_clip)
    update_if_finite(run, state, step_metrics["loss"])
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    return {
        **step_metrics,
        "grad_norm": torch.as_tensor(float("nan") if grad_norm is None else grad_norm).detach(),
        "tokens": accelerator.reduce(step_tokens, "sum"),
        "lr": torch.tensor(run.scheduler.get_last_lr()[0]),
    }


def update_if_finite(run: Run, state: TrainerState, loss: torch.Tensor) -> None:
    """Apply the step unless some rank's loss is not finite; stop after train.max_bad_steps in a
    row. The step's one host sync: every rank must take the same branch, before the update."""
    cfg = run.job.train
    if bool(torch.isfinite(run.accelerator.reduce(loss, "sum"))):
        run.optimizer.step()
        state.bad_steps = 0
        return
    state.bad_steps += 1
    log.warning("step %d: non-finite loss, update skipped (%d in a row)", state.step, state.bad_steps)
    if state.bad_steps >= cfg.max_bad_steps:
        raise RuntimeError(
            f"{state.bad_steps} consecutive non-finite losses at step {state.step}: stopping. "
            "Lower train.lr, use train.precision=fp32, or check the data."
        )


class MetricWindow:
    """Per-step metrics kept on the device and read with one transfer per log interval; the
    progress bar, throughput and the run's closing line."""

    def __init__(self, run: Run, state: TrainerState):
        self.accelerator = run.accelerator
        self.pending: list[dict[str, torch.Tensor]] = []
        self.tick, self.tokens_at_tick = time.perf_counter(), state.tokens
        self.started, self.tokens_at_start, self.first_step = self.tick, state.tokens, state.step
        self.bar = tqdm(
            total=run.job.train.max_steps,
            initial=state.step,
            desc="train",
            disable=not self.accelerator.is_main_process,
        )

    def append(self, metrics: dict[str, torch.Tensor]) -> None:
        self.pending.append(metrics)
        self.bar.update(1)

    def flush(self, state: TrainerState) -> None:
        """Log every pending step at its own step number; count its tokens into the state."""
        rows = _flush(self.pending)
        state.tokens += int(sum(r["tokens"] for r in rows))
        elapsed = time.perf_counter() - self.tick
        tokens_per_s = (state.tokens - self.tokens_at_tick) / max(elapsed, 1e-9)
        first = state.step - len(rows) + 1
        for offset, row in enumerate(rows):
            self.accelerator.log(
                {f"train/{k}": v for k, v in row.items()} | {"train/tokens_per_s": tokens_per_s},
                step=first + offset,
            )
        self.bar.set_postfix(loss=f"{rows[-1]['loss']:.3f}", tok_s=f"{tokens_per_s:.0f}")
        self.pending, self.tick, self.tokens_at_tick = [], time.perf_counter(), state.tokens

    def close(self, state: TrainerState) -> None:
        self.bar.close()
        seconds = time.perf_counter() - self.started
        tokens = state.tokens - self.tokens_at_start
        log.info(
            "rank %d: steps %d-%d, %d tokens over all ranks in %.1f s (%.0f tokens/s); peak memory %.2f GB",
            self.accelerator.process_index, self.first_step, state.step, tokens, seconds,
            tokens / max(seconds, 1e-9), peak_memory_gb(),
        )  # fmt: skip


def validation(run: Run, state: TrainerState) -> None:
    """Held-out metrics, logged, and appended to val_metrics.jsonl by rank 0."""
    val = validate(run.model, run.val_features, run.val_rows, run.job.train, run.pad_id)
    run.accelerator.log(val, step=state.step)
    if run.accelerator.is_main_process:
        record_validation(run.run_dir / VAL_METRICS, state, val)


def snapshot(run: Run, step: int) -> None:
    """The head as it is now under snapshots/step-N (collective under ZeRO-3: every rank calls it)."""
    trained = trained_objective(run.accelerator, run.model, run.whole)
    if run.accelerator.is_main_process:
        save_snapshot(trained, run.target, run.run_dir / SNAPSHOTS / f"step-{step}")


def finish(run: Run, state: TrainerState) -> Path:
    """Check the ranks agree, fit the confidence temperatures on held-out rows, save the head."""
    accelerator = run.accelerator
    if not zero3(accelerator):  # ZeRO-3 ranks hold different shards, not copies
        accelerator.log({"train/rank_weight_spread": weight_spread(accelerator, run.params)}, step=state.step)
    head_dir = run.run_dir / "head"
    objective = trained_objective(accelerator, run.model, run.whole)
    if accelerator.is_main_process:
        if objective.confidence is not None and not len(run.val_rows):
            log.info("no validation split (data.val_fraction=0): confidence temperatures left at 1")
        elif objective.confidence is not None:
            # First fit on the held-out split's own tokens; eval refits on real decoding.
            batches = _val_batches(run.val_features, run.val_rows, run.job.train, run.pad_id)
            log.info("confidence temperatures (held-out proxy): %s", calibrate_on_batches(objective, batches))
        objective.save_pretrained(head_dir)
        run.target.save_identity(head_dir)
    accelerator.wait_for_everyone()
    return head_dir


def peak_memory_gb() -> float:
    """This process's peak resident memory (ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def zero3(accelerator: Accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and plugin.zero_stage == 3


def trained_objective(accelerator: Accelerator, model, whole: Objective | None) -> Objective:
    """The objective with every trained weight in place, on the main process. Under ZeRO-3 the
    shards are gathered into `whole` (collective: every rank calls this)."""
    if whole is None:
        return accelerator.unwrap_model(model)
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        whole.load_state_dict(state)
    return whole


@contextmanager
def whole_target_weights(accelerator: Accelerator):
    """Load the frozen target inside this: while a ZeRO-3 config is registered, transformers
    partitions every model it loads (a target of vocab 0 on every rank)."""
    if not zero3(accelerator):
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        accelerator.state.deepspeed_plugin.set_deepspeed_weakref()


def save_snapshot(objective, target: Target, head_dir: Path) -> None:
    """The head as it is at this step, in our head format (eval/run.py reads it like the final
    one), so a learning curve can be evaluated at several budgets from one run. Confidence
    temperatures stay as trained (eval refits them on decoding)."""
    tmp = head_dir.with_name(head_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    objective.save_pretrained(tmp)
    target.save_identity(tmp)
    shutil.rmtree(head_dir, ignore_errors=True)
    tmp.rename(head_dir)


def keep_validations_up_to(path: Path, step: int) -> None:
    """Drop the lines of validations after `step` (the checkpoint a run resumes from redoes them),
    so a killed and resumed run's file holds each validation once."""
    if path.is_file():
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(line for line in lines if json.loads(line)["step"] <= step))


def record_validation(path: Path, state: TrainerState, val: dict[str, float]) -> None:
    """Log held-out metrics and append them to `path` (one JSON line per validation), so
    learning curves can be read without wandb."""
    log.info(
        "step %d (%d tokens): %s", state.step, state.tokens, " ".join(f"{k}={v:.4f}" for k, v in val.items())
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"step": state.step, "tokens": state.tokens} | val) + "\n")


def weight_spread(accelerator: Accelerator, params: list[torch.Tensor]) -> float:
    """Largest difference of a weight checksum between ranks: 0 when data parallelism held.

    Guards the silent failure of a CPU launch without `cpu=True`: two unsynced processes.
    """
    checksum = torch.stack(
        [torch.stack([p.detach().double().sum(), p.detach().double().square().sum()]) for p in params]
    ).sum(0)
    gathered = accelerator.gather(checksum[None].to(accelerator.device))
    spread = float((gathered - gathered[0]).abs().max())
    if spread > 0:
        raise RuntimeError(f"ranks ended training with different weights (checksum spread {spread:g})")
    return spread


def _flush(pending: list[dict[str, torch.Tensor]]) -> list[dict[str, float]]:
    """Read a window of per-step metrics off the device with one transfer."""
    keys = list(pending[0])
    values = torch.stack([torch.stack([row[k].float().cpu() for k in keys]) for row in pending]).tolist()
    return [dict(zip(keys, row)) for row in values]


def _val_batches(features: FeatureSource, val_rows, cfg, pad_id: int):
    """Features of the first val_batches held-out batches."""
    for first in range(0, min(len(val_rows), cfg.val_batches * cfg.batch_size), cfg.batch_size):
        rows = list(range(first, min(first + cfg.batch_size, len(val_rows))))
        yield features(rows, pad_rows([val_rows[i] for i in rows], pad_id))


@torch.no_grad()
def validate(model, features: FeatureSource, val_rows, cfg, pad_id: int) -> dict[str, float]:
    """Mean metrics (loss, per-step top-1 accuracy) over the first val_batches held-out batches."""
    model.eval()
    totals: dict[str, torch.Tensor] = {}
    batches = 0
    for feats in _val_batches(features, val_rows, cfg, pad_id):
        _, metrics = model(feats)
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0) + v.float()
        batches += 1
    model.train()
    return {f"val/{k}": float(v) / max(batches, 1) for k, v in totals.items()}


RESUME_MAY_CHANGE = {"train.stop_at_step"}  # settings meant to differ between a run's launches


def _warn_overrides(saved: dict, current: dict, prefix: str = "") -> None:
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            _warn_overrides(a, b, f"{prefix}{key}.")
        elif a != b and f"{prefix}{key}" not in RESUME_MAY_CHANGE:
            log.warning("resume: %s%s was %r in the checkpoint, now %r", prefix, key, a, b)
