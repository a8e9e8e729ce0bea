"""Every YAML under conf/ composes into the typed schema, and opens with its command."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from train.config import JobConfig, register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ["target", "data", "head", "train", "eval", "export"]
CHOICES = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
REQUIRED_BY_USER = {
    ("target", "hf"): ["target.name=org/model"],
    ("data", "jsonl"): ["data.sources=[x.jsonl]"],
}


def _compose(overrides: list[str]) -> JobConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize(("group", "choice"), CHOICES)
def test_every_group_choice_composes_into_the_schema(group, choice):
    job = _compose([f"{group}={choice}", *REQUIRED_BY_USER.get((group, choice), [])])
    assert isinstance(job, JobConfig)


def test_every_group_has_a_choice_and_the_default_job_composes():
    assert {g for g, _ in CHOICES} == set(GROUPS)
    job = _compose([])
    assert job.head.kind == "eagle3" and job.target.name == "smollm2-135m-instruct"
    assert job.run_dir == "outputs/eagle3"


def test_unknown_keys_and_wrong_types_are_rejected():
    with pytest.raises(Exception, match="bogus"):
        _compose(["train.bogus=1"])
    with pytest.raises(Exception, match="max_steps"):
        _compose(["train.max_steps=many"])


@pytest.mark.parametrize("path", sorted(CONF.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONF)))
def test_every_yaml_opens_with_the_command_that_uses_it(path):
    lines = path.read_text().splitlines()
    first = lines[1] if lines[0].startswith("# @package") else lines[0]  # Hydra wants @package first
    assert first.startswith("# ") and ("train/run.py" in first or "eval/run.py" in first), first


@pytest.mark.parametrize("path", sorted((CONF / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_accepts_every_launcher_config(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert config.distributed_type in {"MULTI_GPU", "DEEPSPEED", "FSDP"}
    if config.distributed_type == "DEEPSPEED":
        ds_file = CONF.parent / config.deepspeed_config["deepspeed_config_file"]
        assert ds_file.is_file()
        import json

        assert json.loads(ds_file.read_text())["zero_optimization"]["stage"] in (2, 3)


def readme_job_commands() -> list[list[str]]:
    """The overrides of every `train/run.py` command in README.md (continued lines joined)."""
    text = (CONF.parent / "README.md").read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if "train/run.py" not in line or line.lstrip().startswith(("#", "|")):
            continue
        words = line.split("#")[0].split("train/run.py", 1)[1].split()
        commands.append([w.replace("'", "").replace('"', "") for w in words if w not in ("--cfg", "job")])
    return commands


@pytest.mark.parametrize("overrides", readme_job_commands(), ids=lambda o: " ".join(o) or "default")
def test_every_job_command_in_the_readme_composes(overrides):
    job = _compose(overrides)
    assert isinstance(job, JobConfig)


def test_the_readme_commands_were_found():
    commands = readme_job_commands()
    assert [] in commands and ["head=eagle1"] in commands and len(commands) >= 8


def test_the_cpu_recipe_sets_data_and_training_together():
    job = _compose(["train=cpu_recipe"])
    assert job.data.regenerate.enabled and job.data.max_conversations == 640 and job.data.max_length == 1024
    assert job.train.hidden_states == "offline" and job.train.snapshot_every == 50
    assert job.head.init == "random" and _compose([]).head.init == "release"
