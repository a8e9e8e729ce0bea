"""What an export records about the drafter: the "drafter" config section and the README.

Engines ignore unknown config keys (transformers keeps them as attributes, speculators'
pydantic config allows extras), so everything we know goes under one nested "drafter" key:
a top-level key would be at risk, e.g. vLLM's MedusaConfig renames every top-level key
containing "num" and "heads" to num_heads. The README says the same for humans.
"""

from dataclasses import dataclass
from typing import Any

from torch import nn

from eval.verdict import IdentityCheck
from heads.export.gate import describe

# Embedded targets as an engine loads them (heads/target.py names them by package).
ENGINE_TARGET_NAMES = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass
class DrafterMeta:
    target_name: str  # as the job named the target
    target_architectures: list[str]
    tokenizer_hash: str  # heads.target.tokenizer_hash
    draft_length: int  # K a serving engine is told to draft (the verdict's, when it has one)
    gate: dict[str, Any]  # heads/export/gate.py GateDecision.record(): what the gate decided and why
    verdict: dict[str, Any] | None = (
        None  # eval/verdict.py Verdict, as the gate read it (None: forced without)
    )
    confidence: dict[str, Any] | None = None  # set by heads/export/confidence.py
    target_path: str | None = None  # the directory this machine loaded the target from
    local_verifier: bool = (
        False  # name target_path, not the hub name, as the verifier (export.local_verifier)
    )

    @property
    def serving_target(self) -> str:
        """The name a serving engine loads the target by."""
        return ENGINE_TARGET_NAMES.get(self.target_name, self.target_name)

    @property
    def verifier(self) -> str:
        """The target as a config that loads it names it: the local directory when asked (offline
        use, e.g. speculators' from_pretrained without a hub), else the serving name."""
        if self.local_verifier:
            if self.target_path is None:
                raise ValueError("export.local_verifier=true, but the target was not loaded from a directory")
            return self.target_path
        return self.serving_target


# The kinds that read target layers by id and draft over a reduced vocabulary.
LAYER_ID_KINDS = ("eagle3", "dflash")


def draft_vocab_size(head: nn.Module) -> int:
    args = head.args
    return args.draft_vocab_size if head.kind in LAYER_ID_KINDS else args.vocab_size


def drafter_section(
    head: nn.Module, meta: DrafterMeta, layout_name: str, engine_layer_ids: list[int] | None
) -> dict[str, Any]:
    """The "drafter" key of an exported config.json."""
    target = {
        "name": meta.target_name,
        "serving_name": meta.serving_target,
        "local_path": meta.target_path,
        "architectures": meta.target_architectures,
        "tokenizer_sha256": meta.tokenizer_hash,
    }
    if head.kind in LAYER_ID_KINDS:
        target["num_hidden_layers"] = head.args.target_num_layers
        target["layer_ids"] = {
            "ours_output_of_layer": list(head.args.target_layer_ids),
            f"{layout_name}": engine_layer_ids,
        }
    return {
        "head_kind": head.kind,
        "format": layout_name,
        "target": target,
        "draft_vocab_size": draft_vocab_size(head),
        "draft_length": meta.draft_length,
        "gate": meta.gate,
        "verdict": meta.verdict,
        "confidence": meta.confidence,
    }


def _drafting(drafting: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in drafting.items())


def _verdict_rows(verdict: dict[str, Any] | None) -> list[str]:
    """The eval verdict the gate read, quoted: AL per task, break-even, drafting, identity, digest."""
    if verdict is None:
        return [
            "| eval verdict | NONE: exported without an eval (forced): no AL or identity check stands behind it |"
        ]
    identity = IdentityCheck(**verdict["identity"])
    break_even = verdict["break_even_acceptance_length"]
    rows = [
        f"| acceptance length, overall (bonus token included) | {verdict['overall_acceptance_length']:.3f} |"
    ]
    rows += [
        f"| acceptance length, {task} | {al:.3f} |"
        for task, al in sorted(verdict["acceptance_length"].items())
    ]
    rows += [
        f"| break-even AL on the eval's machine (1 + alpha + beta) | "
        f"{'not measured' if break_even is None else f'{break_even:.3f}'} |",
    ]
    rows += [
        f"| break-even AL, {task}: its rounds' mean cost as drafted | {cost:.3f} |"
        for task, cost in sorted((verdict.get("break_even_by_task") or {}).items())
    ]
    rows += [
        f"| drafting at eval | {_drafting(verdict['drafting'])} |",
        f"| greedy output | {identity.describe()} |",
        f"| evaluated head (sha256 of its files) | `{verdict['head_sha256']}` |",
    ]
    return rows


def model_card(config: dict[str, Any], engine: str, serve_hint: str, out_dir: str) -> str:
    """README.md of an export directory, from its config's "drafter" section."""
    drafter = config["drafter"]
    target = drafter["target"]
    k = drafter["draft_length"]
    gate = drafter["gate"]
    lines = [
        f"# {drafter['head_kind'].upper()} drafter for {target['name']} ({drafter['format']} layout)",
        "",
        f"Loaded by: {engine}.",
        "",
        "| | |",
        "|---|---|",
        f"| target | `{target['name']}` (serve it as `{target['serving_name']}`) |",
        f"| tokenizer sha256 | `{target['tokenizer_sha256']}` |",
        f"| draft vocab size | {drafter['draft_vocab_size']} |",
        f"| draft length K to serve with | {drafter['draft_length']} |",
    ]
    lines += _verdict_rows(drafter["verdict"])
    if "layer_ids" in target:
        ids = target["layer_ids"]
        lines.append(
            f"| target layer ids | ours (output of layer i) {ids['ours_output_of_layer']}; "
            f"as written for {drafter['format']}: {ids[drafter['format']]} |"
        )
    lines.append(f"| export gate | {describe(gate)} |")
    if drafter["confidence"]:
        conf = drafter["confidence"]
        lines.append(
            f"| confidence head | `{conf['weights']}` + `{conf['config']}` (no engine loader reads this folder) |"
        )
    lines += [
        "",
        "Serve:",
        "",
        "```",
        serve_hint.format(dir=out_dir, target=target["serving_name"], k=k, k1=k + 1),
        "```",
        "",
        "The weights were reloaded from this directory with the engine's published layout and",
        "gave the same logits as the trained head before the export was kept.",
    ]
    if drafter["confidence"]:
        lines += [
            "",
            "The confidence head (which drafts will survive) sits in its own folder, where engine",
            "loaders never look: a server that uses it reads that folder with",
            "`heads.confidence.load_confidence(<dir>/confidence, embed_weight=<target embedding>)`,",
            "and `python -m heads.export import` brings it back beside the drafter.",
        ]
    if gate["forced"]:
        lines += [
            "",
            "WARNING: exported with export.force=true although the eval gate refused it: "
            f"{'; '.join(gate['refusals'])}.",
        ]
    return "\n".join(lines) + "\n"
