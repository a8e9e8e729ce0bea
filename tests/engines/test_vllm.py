"""Our exports served by vLLM's CPU build, as written (opt-in: needs `.venv-vllm`, made by
eval/engines/setup_vllm.sh; `.ci/run` makes it when it can, and these tests skip without it).

For each layout meant for vLLM (EAGLE-3 in our vllm and speculators layouts; EAGLE-1;
Medusa; the block drafter in the speculators layout), on the embedded target in fp32, greedy:
  - vLLM's output with our drafter is vLLM's output without it, token for token;
  - vLLM's own spec-decode counters (drafts, draft tokens, accepted, accepted per position)
    equal our decoder's on the same prompts, head and draft length. Every prompt ends at
    EOS inside the budget, where the two count alike (at a max_tokens cut vLLM still counts
    the drafts it proposed past the budget; our decoder caps them). Both run the same fp32
    weights on this CPU, so equality is required: a gap is a layout bug (layer ids, d2t,
    norms, rope) that loads silently, since vLLM's EAGLE loaders skip its own check for
    weights left uninitialised.
Our SGLang layout loads in vLLM too, but vLLM takes its layer ids in another convention: on
these prompts it accepted 77 drafts where our decoder (and vLLM on the vllm export) accepted
79, per position [55, 18, 4] against [58, 20, 1]. Its card says to serve the vllm export.
"""

import json
from pathlib import Path

import pytest

from eval.engines.vllm_served import vllm_generate, vllm_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (bash eval/engines/setup_vllm.sh)"),
]

K = 3
MAX_TOKENS = 256
PROMPTS = [
    "What is the capital of France?",
    "Write a python function that reverses a list.",
    "Explain photosynthesis in two sentences.",
]
RELEASE = Path(__file__).resolve().parents[2] / "heads" / "release" / "smollm2-135m-eagle3"


@pytest.fixture(scope="module")
def prompts(smollm2):
    from eval.run import encode_turn

    return [encode_turn(smollm2, [], turn) for turn in PROMPTS]


@pytest.fixture(scope="module")
def plain_vllm(smollm2, prompts):
    return vllm_generate(smollm2.model_dir, prompts, MAX_TOKENS)


def _trained_head(kind: str, root: Path) -> Path:
    """A short run on the embedded target: enough for drafts that are sometimes accepted
    (Medusa with K heads: each holds a trainable copy of the 49k-token lm_head; a block drafter
    with a block of K + 1, the anchor and K mask slots, the one block vLLM drafts it with)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.conftest import CONF
    from train.config import register_configs
    from train.run import run

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                f"head={kind}", "head.confidence=false", *([f"head.medusa_heads={K}"] if kind == "medusa" else []),
                *([f"head.block_size={K + 1}"] if kind == "dflash" else []), "target.dtype=float32", "data.max_conversations=96", "data.max_length=256",
                "data.val_fraction=0", "train.max_steps=40", "train.batch_size=2", "train.warmup_steps=4",
                "train.lr=3e-3", "train.precision=fp32", "train.log_every=10", "train.checkpoint_every=1000", "wandb.mode=disabled",
                "stages=[prepare,train]", f"run_dir={root}",
            ],
        )  # fmt: skip
    return Path(run(OmegaConf.to_object(cfg))["head_dir"])


def _export(head_dir: Path, target_name: str, format_name: str, out: Path) -> Path:
    from heads.export.__main__ import main

    extra = ["--local-verifier"] if format_name == "speculators" else []
    return main(
        ["--head", str(head_dir), "--target", target_name, "--format", format_name, "--out", str(out)]
        + ["--force", "--draft-length", str(K), *extra]
    )


def _ours(smollm2, head_dir: Path, kind: str, prompts) -> dict:
    """Our decoder on the same prompts: outputs and the counters vLLM keeps."""
    from eval.config import EvalConfig
    from eval.decoder import MedusaTreeDrafting, SpeculativeDecoder
    from eval.run import load_trained_head, make_decoder

    head = load_trained_head(smollm2, head_dir)
    if kind == "medusa":  # vLLM's Medusa drafts a chain: each head's top-1
        chain = MedusaTreeDrafting(paths=tuple((0,) * depth for depth in range(1, K + 1)))
        decoder = SpeculativeDecoder(smollm2.model, head, chain, 1024, smollm2.tokenizer.eos_token_id)
    else:
        decoder = make_decoder(smollm2, head, kind, EvalConfig(draft_length=K, policy="static"), 1024)
    outputs, rounds, proposed, accepted, per_position = [], 0, 0, 0, [0] * K
    for prompt in prompts:
        generation = decoder.generate(prompt, MAX_TOKENS)
        assert generation.stopped_by_eos, "choose prompts that end inside the budget (see the docstring)"
        metrics = generation.metrics
        outputs.append(generation.tokens)
        rounds, proposed = rounds + metrics.verification_rounds, proposed + metrics.proposed_tokens
        accepted += metrics.accepted_draft_tokens
        per_position = [a + b for a, b in zip(per_position, metrics.accepted_per_position)]
    return {
        "outputs": outputs,
        "spec": {
            "drafts": rounds,
            "draft_tokens": proposed,
            "accepted": accepted,
            "per_position": per_position,
        },
    }


def _check_served(smollm2, prompts, plain_vllm, head_dir: Path, kind: str, export_dir: Path) -> dict:
    served = vllm_generate(smollm2.model_dir, prompts, MAX_TOKENS, export_dir, kind, K)
    assert served.outputs == plain_vllm.outputs  # speculation changed nothing vLLM emits
    ours = _ours(smollm2, head_dir, kind, prompts)
    assert ours["outputs"] == served.outputs
    assert served.spec == ours["spec"], json.dumps({"vllm": served.spec, "ours": ours["spec"]})
    return served.spec


@pytest.mark.parametrize("format_name", ["vllm", "speculators"])
def test_eagle3_exports_are_served_by_vllm_with_our_decoders_acceptance(
    format_name, smollm2, prompts, plain_vllm, tmp_path
):
    export_dir = _export(RELEASE, "smollm2-135m-instruct", format_name, tmp_path / format_name)
    assert (export_dir / "confidence" / "confidence.safetensors").is_file()  # shipped, out of vLLM's way
    _check_served(smollm2, prompts, plain_vllm, RELEASE, "eagle3", export_dir)


@pytest.mark.parametrize("kind", ["eagle1", "medusa"])
def test_eagle1_and_medusa_exports_are_served_by_vllm_with_our_decoders_acceptance(
    kind, smollm2, prompts, plain_vllm, tmp_path
):
    head_dir = _trained_head(kind, tmp_path / "run")
    export_dir = _export(head_dir, "smollm2-135m-instruct", "vllm", tmp_path / "export")
    _check_served(smollm2, prompts, plain_vllm, head_dir, kind, export_dir)


def test_the_block_drafter_export_is_served_by_vllm_with_our_decoders_acceptance(
    smollm2, prompts, plain_vllm, tmp_path
):
    head_dir = _trained_head("dflash", tmp_path / "run")
    export_dir = _export(head_dir, "smollm2-135m-instruct", "speculators", tmp_path / "export")
    assert (export_dir / "mask_embedding.pt").is_file()  # the learned mask input, read by vLLM by name
    spec = _check_served(smollm2, prompts, plain_vllm, head_dir, "dflash", export_dir)
    # Equal counters say something only where drafts land. Slot 1 attends to every mask slot of
    # the block, so causal or misplaced slots change it too. Measured: 246 drafts of 3, 14 accepted,
    # per position [14, 0, 0], in vLLM and in our decoder alike.
    assert spec["accepted"] > 0, spec


def test_a_layout_vllm_refuses_fails_by_name(smollm2, prompts, tmp_path):
    export_dir = _export(RELEASE, "smollm2-135m-instruct", "vllm", tmp_path / "vllm")
    config = json.loads((export_dir / "config.json").read_text())
    config["architectures"] = ["NoSuchEagleForCausalLM"]  # a drafter class vLLM does not have
    (export_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match=r"(?s)vLLM refused .*NoSuchEagleForCausalLM"):
        vllm_generate(smollm2.model_dir, prompts[:1], 8, export_dir, "eagle3", K)
