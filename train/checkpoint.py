"""Save and resume training state: weights, optimizer, scheduler, RNG and data position.

Each checkpoint is written into `<name>.tmp` and renamed when complete, so a crash or a
full disk mid-write leaves the previous checkpoint valid. accelerate writes the state
(it knows how to gather DeepSpeed/FSDP shards); we add `files.json`, every file it wrote
with its size, and last `trainer_state.json` with the step, the head's kind and args, and
the resolved job config. A checkpoint that lost a file since (a partial copy, a cleanup)
is incomplete: `train.resume=auto` names it and the missing file, and resumes from the
newest complete one; with none complete it stops rather than silently start afresh
(`train.resume=never` starts a fresh run). Checkpoints written before files.json existed
count as complete when they hold trainer_state.json.
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
FILES = "files.json"  # relative path -> size of every file accelerate wrote
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
    """Finished checkpoints under root, oldest first (unfinished .tmp dirs are ignored)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def list_files(path: Path) -> dict[str, int]:
    """Relative path -> size of every file under a checkpoint directory."""
    return {str(f.relative_to(path)): f.stat().st_size for f in sorted(path.rglob("*")) if f.is_file()}


def missing_files(path: Path) -> list[str]:
    """The files a checkpoint recorded that are gone or have another size (empty: complete)."""
    if not (path / FILES).is_file():
        return []  # written before files.json: trainer_state.json is all it has to show
    present = list_files(path)
    recorded = json.loads((path / FILES).read_text())
    return [name for name, size in recorded.items() if present.get(name) != size]


def find_resume_dir(resume: str, root: Path) -> Path | None:
    """`train.resume`: auto = the newest complete checkpoint under root (or none), never = none,
    else a path (which must be complete)."""
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if not (path / STATE_FILE).is_file():
            raise FileNotFoundError(f"train.resume={resume!r}: no {STATE_FILE} in that directory")
        if missing_files(path):
            raise FileNotFoundError(f"train.resume={resume!r}: incomplete checkpoint, {_lacks(path)}")
        return path
    found = checkpoint_dirs(root)
    for path in reversed(found):
        if not missing_files(path):
            return path
        log.warning("checkpoint %s is incomplete (%s): trying an older one", path, _lacks(path))
    if found:
        raise FileNotFoundError(
            f"no complete checkpoint under {root} ({len(found)} incomplete; the newest {_lacks(found[-1])}): "
            "restore the files, or set train.resume=never to train from scratch"
        )
    return None


def _lacks(path: Path) -> str:
    return "missing or cut short: " + ", ".join(missing_files(path))


def save_checkpoint(accelerator: Accelerator, root: Path, state: TrainerState, keep: int = 2) -> Path:
    final = root / f"step_{state.step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()  # every rank's files are written before they are listed
    if accelerator.is_main_process:
        (tmp / FILES).write_text(json.dumps(list_files(tmp), indent=2))
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
