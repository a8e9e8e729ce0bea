"""The export stage: the eval gate (gate.py), then one validated directory per requested format.

An export is written to `<out>.tmp`, validated there (validate.py) and only then renamed
over `<out>`, so a directory under <run_dir>/export/ is always one that passed.
"""

import json
import logging
import shutil
from dataclasses import asdict, replace
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from eval.verdict import VERDICT_FILE
from heads.export.card import DrafterMeta, model_card
from heads.export.confidence import copy_confidence
from heads.export.formats import formats_for, layout_for
from heads.export.gate import GATE_FILE, GateDecision, gate
from heads.export.layouts import CannotExpress, Layout, TargetWeights
from heads.export.validate import validate_export
from heads.registry import load_head, read_head_config

log = logging.getLogger(__name__)


def drafter_meta(
    target_name: str,
    target,
    draft_length: int,
    decision: GateDecision,
    local_verifier: bool = False,
) -> DrafterMeta:
    """What the export records, from heads.target.Target and the gate's decision. draft_length:
    the K a serving engine is told (the verdict's when it has one)."""
    drafting = decision.verdict.drafting if decision.verdict is not None else {}
    return DrafterMeta(
        target_name=target_name,
        target_architectures=list(getattr(target.config, "architectures", None) or []),
        tokenizer_hash=target.tokenizer_hash,
        draft_length=drafting.get("draft_length", drafting.get("depth", draft_length)),
        gate=decision.record(),
        verdict=asdict(decision.verdict) if decision.verdict is not None else None,
        target_path=target.model_dir,
        local_verifier=local_verifier,
    )


def _write(
    tmp: Path, out_dir: Path, layout: Layout, head: nn.Module, meta: DrafterMeta, target: TargetWeights
) -> None:
    config = layout.config(head, meta)
    tensors = {name: t.detach().contiguous() for name, t in layout.tensors(head, target).items()}
    save_file(tensors, str(tmp / layout.weights_file), metadata={"format": "pt"})
    layout.write_side_files(head, tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    record = {"gate": meta.gate, "verdict": meta.verdict}
    (tmp / GATE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    (tmp / "README.md").write_text(model_card(config, layout.engine, layout.serve_hint, str(out_dir)))


def export_head(
    head: nn.Module,
    layout: Layout,
    out_dir: str | Path,
    meta: DrafterMeta,
    target: TargetWeights,
    head_dir: str | Path | None = None,
) -> Path:
    """Write `head` in `layout` to out_dir, validated; head_dir's confidence files go along."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        confidence = copy_confidence(Path(head_dir), tmp) if head_dir is not None else None
        _write(tmp, out_dir, layout, head, replace(meta, confidence=confidence), target)
        validate_export(tmp, layout, head, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    log.info("exported %s head in the %s layout to %s (validated)", head.kind, layout.name, out_dir)
    return out_dir


def export_job(job, target, head_dir: str | Path) -> list[Path]:
    """The job's export stage: <run_dir>/export/<format>/ for each of job.export.formats (None:
    every format of the head's kind that can express the head: one that cannot is skipped with
    a warning naming the option, while a format asked for by name is refused).

    job: train.config.JobConfig; target: heads.target.Target.
    """
    head_dir = Path(head_dir)
    kind = read_head_config(head_dir)["kind"]
    names = formats_for(kind) if job.export.formats is None else job.export.formats
    layouts = [layout_for(kind, name) for name in names]  # every name checked before any write
    verdict_path = Path(job.run_dir) / "eval" / VERDICT_FILE
    decision = gate(verdict_path, head_dir, job.export.min_acceptance_length, job.export.force)
    weights = TargetWeights.from_target(target).for_export()
    head = load_head(
        head_dir,
        embed_weight=weights.embed_weight,
        lm_head_weight=weights.lm_head_weight,
        target_config=target.config,
    )
    meta = drafter_meta(job.target.name, target, job.eval.draft_length, decision, job.export.local_verifier)
    exported = []
    for layout in layouts:
        try:
            exported.append(
                export_head(head, layout, Path(job.run_dir) / "export" / layout.name, meta, weights, head_dir)
            )
        except CannotExpress as error:
            if job.export.formats is not None:  # asked for by name: refuse
                raise
            log.warning("export: no %s layout: %s", layout.name, error)
    return exported
