"""Suite-wide setup: never reach a model hub, keep torch to the CI machine's two cores."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No GPU in CI: Triton kernels run in the interpreter, checked against their torch references.
os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tests.helpers import tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_cfg():
    """The embedded target, converted once into the user cache and reused by every test."""
    from heads.target import TargetConfig, resolve_model_dir

    cfg = TargetConfig(name="smollm2-135m-instruct", dtype="float32", device="cpu")
    resolve_model_dir(cfg)
    return cfg


@pytest.fixture(scope="session")
def smollm2(smollm2_cfg):
    from heads.target import Target

    return Target.load(smollm2_cfg)


# A tiny random target with the real SmolLM2 tokenizer, saved as a model directory, and a
# small chat data set: enough to run the real job (prepare → train → eval) in seconds.
CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, smollm2_cfg) -> Path:
    from heads.target import load_tokenizer

    tokenizer = load_tokenizer(smollm2_cfg)
    model = tiny_llama(num_layers=4, vocab_size=len(tokenizer), hidden_size=64, seed=1)
    path = tmp_path_factory.mktemp("tiny_target")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def chats_jsonl(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = "the a cat dog sat ran on under table chair big small red blue quickly slowly".split()
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    with open(path, "w") as f:
        for i in range(40):
            question = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
            answer = " ".join(rng.choice(words) for _ in range(rng.randint(8, 30)))
            messages = [
                {"role": "user", "content": f"{i}: {question}"},
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def compose_job(target_dir: Path, chats: Path, cache_dir: Path, run_dir: Path, *overrides: str):
    """A JobConfig for the tiny target (any override as on the command line)."""
    from train.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                f"target.name={target_dir}",
                "target.device=cpu",
                "target.dtype=float32",  # the figures tests pin; auto is bf16 on a CPU with native bf16
                f"data.sources=[{chats}]",
                "data.max_conversations=null",
                "data.max_length=96",
                "data.val_fraction=0.1",
                f"data.cache_dir={cache_dir}",
                "head.layer_ids=[0,1,2]",
                "head.draft_vocab_size=512",
                "train.ttt_steps=3",
                "train.batch_size=2",
                "train.max_steps=6",
                "train.warmup_steps=2",
                "train.log_every=2",
                "train.val_every=3",
                "train.val_batches=2",
                "train.checkpoint_every=3",
                "train.loss_chunk_tokens=64",
                "train.precision=fp32",  # the same on every machine (auto is bf16 where native)
                "wandb.mode=disabled",
                "stages=[prepare,train]",
                f"run_dir={run_dir}",
                *overrides,
            ],
        )
    return OmegaConf.to_object(cfg)


@pytest.fixture
def make_job(tiny_target_dir, chats_jsonl, tmp_path):
    """compose_job in this test's tmp_path."""

    def make(*overrides: str, run_dir: Path | None = None):
        return compose_job(
            tiny_target_dir, chats_jsonl, tmp_path / "data_cache", run_dir or tmp_path / "run", *overrides
        )

    return make
