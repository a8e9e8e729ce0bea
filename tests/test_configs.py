"""Every YAML under conf/ composes into the typed schema, and opens with the command that runs it:
that command, and every command in the README, composes under its entry's schema."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eval.run import EvalRunConfig
from train.config import JobConfig, register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ENTRIES = {"train/run.py": "config", "eval/run.py": "eval_run"}  # entry -> its primary config
GROUPS = ["target", "data", "head", "train", "eval", "export"]
CHOICES = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
REQUIRED_BY_USER = {
    ("target", "hf"): ["target.name=org/model"],
    ("data", "jsonl"): ["data.sources=[x.jsonl]"],
}


def _compose(overrides: list[str], config_name: str = "config") -> JobConfig | EvalRunConfig:
    register_configs()  # eval_run's schema registered itself when eval.run was imported
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides)
    return OmegaConf.to_object(cfg)


def parse_command(command: str) -> tuple[str, list[str]]:
    """(entry, overrides) of a shell command that runs train/run.py or eval/run.py: the words
    after the script, `--cfg job` dropped, quotes and trailing comments as the shell reads them."""
    words = shlex.split(command.replace("\\\n", " "), comments=True)
    at = next(i for i, word in enumerate(words) if word.endswith(tuple(ENTRIES)))
    entry = next(e for e in ENTRIES if words[at].endswith(e))
    overrides = [w for w in words[at + 1 :] if w not in ("--cfg", "job")]
    return entry, overrides


def compose_command(command: str) -> JobConfig | EvalRunConfig:
    """The config a command of train/run.py or eval/run.py runs with, as its entry composes it."""
    entry, overrides = parse_command(command)
    return _compose(overrides, ENTRIES[entry])


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


def first_command(path: Path) -> str:
    """The command a conf/ YAML opens with (after Hydra's `# @package` header), continued lines joined."""
    lines = [line for line in path.read_text().splitlines() if not line.startswith("# @package")]
    command = lines[0].removeprefix("# ")
    for line in lines[1:]:
        if not command.endswith("\\"):
            break
        command = command[:-1] + line.removeprefix("#")
    return command


YAMLS = sorted(CONF.rglob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(CONF)))
def test_every_yaml_opens_with_a_command_that_runs_it(path):
    """The first line is a command of one of our entries that selects this file, and it composes."""
    command = first_command(path)
    entry, overrides = parse_command(command)
    name = path.relative_to(CONF)
    if name.parent == Path("accelerate"):
        assert f"--config_file conf/{name}" in command, command
    elif name.parent == Path("."):
        assert ENTRIES[entry] == path.stem, command  # a primary config: its own entry runs it
    else:
        assert f"{name.parent}={path.stem}" in overrides, command
    assert isinstance(_compose(overrides, ENTRIES[entry]), (JobConfig, EvalRunConfig))


def test_every_primary_config_has_an_entry():
    assert sorted(ENTRIES.values()) == sorted(p.stem for p in CONF.glob("*.yaml"))


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


def readme_commands() -> list[str]:
    """Every train/run.py and eval/run.py command in README.md's code blocks (continued lines joined)."""
    blocks = (ROOT / "README.md").read_text().split("```")[1::2]
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if any(e in line.split("#")[0] for e in ENTRIES)]


@pytest.mark.parametrize(
    "command", readme_commands(), ids=lambda c: " ".join(parse_command(c)[1]) or "default"
)
def test_every_command_in_the_readme_composes(command):
    assert isinstance(compose_command(command), (JobConfig, EvalRunConfig))


def test_the_readme_commands_were_found():
    commands = [parse_command(c) for c in readme_commands()]
    assert ("train/run.py", []) in commands and ("train/run.py", ["head=eagle1"]) in commands
    assert sum(entry == "eval/run.py" for entry, _ in commands) >= 1 and len(commands) >= 8


def test_the_eval_command_takes_the_jobs_groups_and_rejects_what_the_schema_lacks():
    run = compose_command(
        "python eval/run.py head_dir=h out=o eval=full eval.draft_length=8 target=hf target.name=m"
    )
    assert run.eval.prompts_per_task is None and run.eval.draft_length == 8 and run.target.name == "m"
    with pytest.raises(Exception, match="bogus"):
        compose_command("python eval/run.py head_dir=h out=o eval.bogus=1")
    with pytest.raises(Exception, match="draft_length"):
        compose_command("python eval/run.py head_dir=h out=o eval.draft_length=many")


def test_the_eval_entry_prints_its_config_and_needs_a_head():
    """The entry as users run it (Hydra's own argument parsing, config path and schema)."""
    script = [sys.executable, "eval/run.py", "head_dir=h", "out=o", "eval=full", "--cfg", "job"]
    printed = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "head_dir: h" in printed.stdout and "prompts_per_task: null" in printed.stdout
    with pytest.raises(Exception, match="head_dir"):
        compose_command("python eval/run.py out=o")


def test_the_cpu_recipe_sets_data_and_training_together():
    job = _compose(["train=cpu_recipe"])
    assert job.data.regenerate.enabled and job.data.max_conversations == 640 and job.data.max_length == 1024
    assert job.train.hidden_states == "offline" and job.train.snapshot_every == 50
    assert job.head.init == "random" and _compose([]).head.init == "release"
