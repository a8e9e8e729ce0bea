"""Typed schema of the job config (Hydra structured configs).

Every YAML under conf/ is merged into these dataclasses, so an unknown key or a value of
the wrong type stops the job at start-up with the key named. Defaults live here and only
here; the YAMLs say which choice a group makes and why.
"""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from data.prepare import DataConfig
from eval.config import EvalConfig
from heads.eagle3 import Eagle3Variant
from heads.export.config import ExportConfig
from heads.target import TargetConfig

STAGES = ("prepare", "train", "eval", "export")


@dataclass
class HeadConfig:
    # eagle3 | eagle1 | medusa | dflash (block drafter)
    kind: str = "eagle3"
    # EAGLE-3 target layers, internal convention (id i = output of layer i);
    # null = [1, n//2 - 1, n - 4], the layers SpecForge and vLLM use.
    layer_ids: list[int] | None = None
    # Reduced output vocabulary of EAGLE-3 (most frequent training tokens). Smaller drafts
    # faster and trains faster; too small caps acceptance (coverage is reported). 0 = full.
    draft_vocab_size: int = 16384
    # How the head starts: random; target_layer (EAGLE-3: its decoder layer a copy of the target
    # layer after the highest feature layer, fc passing that feature layer through); release (the
    # head heads/release/ ships for this target and kind, else random); or a trained head's
    # directory (warm start: its weights and draft vocabulary, then training on this job's data).
    init: str = "random"
    # EAGLE-3 layer variants (heads/eagle3.py Eagle3Variant, speculators' names), e.g.
    # head.variant.norm_before_residual=true. All off (default) is the layout SGLang, vLLM and
    # speculators all serve; a variant exports only to the layouts that carry it.
    variant: Eagle3Variant = field(default_factory=Eagle3Variant)
    # Medusa: number of heads (head i predicts token i+2 ahead) and ResBlocks per head.
    medusa_heads: int = 4
    medusa_layers: int = 1
    # Block drafter (dflash): the anchor + block_size - 1 drafts per forward; its decoder layers;
    # blocks trained per row and step (anchors sampled anew each step); slot j's loss weight
    # exp(-(j - 1)/γ); the id engines mark mask slots with (null: the tokenizer's mask token, else
    # the last vocabulary id; the head learns its own mask embedding either way).
    block_size: int = 8
    dflash_layers: int = 1
    max_anchors: int = 128
    dflash_decay_gamma: float = 4.0
    mask_token_id: int | None = None
    # Train a confidence head beside the drafter (predicts which draft tokens survive).
    confidence: bool = True
    # joint: in the same run, on detached drafter states (the drafter trains exactly as without
    # it); frozen: only the confidence head trains, on the head at confidence_drafter (a short
    # second run, e.g. to add confidence to a drafter trained elsewhere).
    confidence_training: str = "joint"
    confidence_drafter: str | None = None
    # BCE weight exp(-k/γ) of draft step k: small γ fits the first steps best, large γ the deep ones.
    confidence_gamma: float = 4.0
    # Decode temperature the acceptance labels assume; 0 = greedy (draft argmax == target argmax).
    # Match eval.temperature: a head trained for greedy is over-confident when sampling.
    confidence_temperature: float = 0.0
    # L2 penalty λ·‖w‖² on the confidence head's weights, added to its mean BCE. The head's
    # features only weakly predict acceptance on new text; unpenalised it spreads its predictions
    # on patterns of the training text, which calibration then cannot undo (measured: BENCHMARKS.md).
    confidence_l2: float = 0.1


@dataclass
class WandbConfig:
    # offline writes runs under <run_dir>/wandb for `wandb sync`; online needs WANDB_API_KEY;
    # disabled logs nothing. auto = online when a key is set, else offline.
    mode: str = "auto"
    project: str = "drafter"
    entity: str | None = None
    name: str | None = None


@dataclass
class TrainConfig:
    # online: the frozen target runs inside each step (no disk, target FLOPs every epoch);
    # offline: a prepare step caches hidden states to disk once (fast epochs, GBs of disk).
    hidden_states: str = "online"
    # Training-time-test unroll depth of EAGLE-3 (EAGLE uses 7); cost grows linearly.
    ttt_steps: int = 7
    # Rows per optimizer step = batch_size x grad_accum x processes.
    batch_size: int = 4
    grad_accum: int = 1
    # Micro-batches of rows of about one length (train/batches.py): ~3% padding instead of ~25%.
    group_by_length: bool = True
    # Optimizer steps; the schedule (warm-up, then lr_schedule) spans them.
    max_steps: int = 300
    lr: float = 1e-3
    warmup_steps: int = 20
    # After the linear warm-up: cosine (to 0 at max_steps) | linear (to 0) | constant.
    lr_schedule: str = "cosine"
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    # fp32 | bf16 | auto. bf16 autocast is ~2x faster on CPUs with AMX or avx512_bf16 (offline
    # hidden states), ~25x slower without; auto = bf16 where it runs natively, else fp32.
    precision: str = "fp32"
    # Tokens per chunk of the vocab-sized loss; lower saves memory, higher is faster.
    loss_chunk_tokens: int = 1024
    seed: int = 0
    log_every: int = 10
    val_every: int = 100
    val_batches: int = 8
    checkpoint_every: int = 100
    # Also save the head itself every this many steps (<run_dir>/snapshots/step-N, evaluable like
    # the final head): learning curves from one run. 0 = never (each snapshot is the head's size).
    snapshot_every: int = 0
    # auto: continue from the newest checkpoint in run_dir; never: start fresh; or a path.
    resume: str = "auto"
    # Checkpoint and stop at this step (0 = run to max_steps), keeping max_steps' schedule: a
    # long run split over time-limited machines; the same command without it goes on.
    stop_at_step: int = 0
    # Stop after this many consecutive non-finite losses (each one skips its step).
    max_bad_steps: int = 3


@dataclass
class JobConfig:
    target: TargetConfig = MISSING
    data: DataConfig = MISSING
    head: HeadConfig = MISSING
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    export: ExportConfig = MISSING
    wandb: WandbConfig = field(default_factory=WandbConfig)
    # Which stages run, in order: prepare, train, eval, export.
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    # Everything the job writes (data, checkpoints, reports, exports, wandb) goes here.
    run_dir: str = "outputs/default"
    # A rerun reuses a finished eval and export whose inputs (the head's files, their settings,
    # the target, the prompts, the report) are unchanged; false reruns them (after a code change).
    reuse: bool = True


def register_configs() -> None:
    """Make `job_schema` (the first entry of conf/config.yaml's defaults) type every group."""
    ConfigStore.instance().store(name="job_schema", node=JobConfig)
