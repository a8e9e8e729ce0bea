"""Save and resume training state: weights, optimizer, scheduler, RNG and data position.

Each checkpoint is written into `<name>.tmp` and renamed when complete, so a crash or a
full disk mid-write leaves the previous checkpoint valid. accelerate writes the state
(it knows how to gather DeepSpeed/FSDP shards); we add `trainer_state.json` with the
step, the head's kind and args, and the resolved job config.
"""

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
STEP_DIR = re.compile(r"^step_(\d{8})$")


@dataclass
class TrainerState:
    step: int  # optimizer steps completed
    tokens: int  # target tokens consumed, summed over ranks
    bad_steps: int  # consecutive non-finite losses at save time
    head_kind: str
    head_args: dict
    config: dict


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under root, oldest first (unfinished .tmp dirs are ignored)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def find_resume_dir(resume: str, root: Path) -> Path | None:
    """`train.resume`: auto = newest under root (or none), never = none, else a path."""
    if resume == "never":
        return None
    if resume == "auto":
        found = checkpoint_dirs(root)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"train.resume={resume!r}: no {STATE_FILE} in that directory")
    return path


def save_checkpoint(accelerator: Accelerator, root: Path, state: TrainerState, keep: int = 2) -> Path:
    final = root / f"step_{state.step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(state.__dict__, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in checkpoint_dirs(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, path: Path, head_kind: str) -> TrainerState:
    state = TrainerState(**json.loads((path / STATE_FILE).read_text()))
    if state.head_kind != head_kind:
        raise ValueError(
            f"{path}: checkpoint of a {state.head_kind!r} head, but head.kind={head_kind!r}; "
            "set train.resume=never or another run_dir"
        )
    accelerator.load_state(str(path))
    log.info("resumed from %s at step %d", path, state.step)
    return state
