"""Which layout a format name means for each head kind (export.formats, the CLI's --format)."""

from typing import Any

from heads.export.layouts import Layout
from heads.export.medusa import MedusaReference, VLLMMedusa
from heads.export.sglang import SGLangEagle3
from heads.export.speculators import SpeculatorsEagle3
from heads.export.speculators_dflash import SpeculatorsDFlash
from heads.export.vllm import VLLMEagle1, VLLMEagle3

LAYOUTS: dict[tuple[str, str], Layout] = {
    (layout.kind, layout.name): layout
    for layout in (
        SGLangEagle3(),
        VLLMEagle3(),
        SpeculatorsEagle3(),
        SpeculatorsDFlash(),
        VLLMEagle1(),
        VLLMMedusa(),
        MedusaReference(),
    )
}


def formats_for(kind: str) -> list[str]:
    return [name for layout_kind, name in LAYOUTS if layout_kind == kind]


def layout_for(kind: str, format_name: str) -> Layout:
    if (kind, format_name) not in LAYOUTS:
        raise ValueError(
            f"export format {format_name!r} does not exist for a {kind!r} head "
            f"(formats for {kind}: {formats_for(kind)})"
        )
    return LAYOUTS[(kind, format_name)]


# vLLM architectures name the head kind; a bare LlamaForCausalLM could be EAGLE-1 or EAGLE-3.
_VLLM_KIND_BY_ARCHITECTURE = {
    "Eagle3LlamaForCausalLM": "eagle3",
    "LlamaForCausalLMEagle3": "eagle3",
    "EagleLlamaForCausalLM": "eagle1",
    "MedusaModel": "medusa",
}


def detect_kind(config: dict[str, Any], format_name: str, where: str) -> str:
    """The head kind an engine config holds, for formats that hold more than one."""
    kinds = sorted({kind for kind, name in LAYOUTS if name == format_name})
    if not kinds:
        raise ValueError(f"unknown format {format_name!r} (formats: {sorted({name for _, name in LAYOUTS})})")
    if len(kinds) == 1:
        return kinds[0]
    found = {
        _VLLM_KIND_BY_ARCHITECTURE[a]
        for a in config.get("architectures") or []
        if a in _VLLM_KIND_BY_ARCHITECTURE
    }
    if config.get("model_type") == "medusa":
        found.add("medusa")
    if config.get("speculators_model_type") in kinds:  # the speculators format names its algorithm
        found.add(config["speculators_model_type"])
    if len(found) != 1:
        raise ValueError(
            f"{where}: cannot tell the head kind from architectures={config.get('architectures')!r}; "
            f"name it (--kind, one of {kinds})"
        )
    return found.pop()
