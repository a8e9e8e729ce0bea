"""Our exports served by vLLM, and vLLM's counters beside our decoder's on the same prompts.

vLLM lives in its own environment (eval/engines/setup_vllm.sh makes `.venv-vllm`; or point
DRAFTER_VLLM_PYTHON at another interpreter), so it is run as a subprocess of
eval/engines/vllm_generate.py, which imports nothing of ours.
"""

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("vllm_generate.py")
METHOD_BY_KIND = {
    "eagle3": "eagle3",
    "eagle1": "eagle",
    "medusa": "medusa",
    "dflash": "dflash",
}  # vLLM's spelling


def vllm_python() -> Path | None:
    """The interpreter of vLLM's environment, or None when there is none (or it is unfinished)."""
    configured = os.environ.get("DRAFTER_VLLM_PYTHON")
    if configured:
        return Path(configured) if Path(configured).is_file() else None
    venv = REPO / ".venv-vllm"
    return venv / "bin" / "python" if (venv / "READY").is_file() else None


@dataclass
class VLLMRun:
    outputs: list[list[int]]  # new token ids per prompt
    seconds: float
    tokens: int
    spec: dict | None  # drafts, draft_tokens, accepted, per_position (vLLM's own counters)

    @property
    def acceptance_length(self) -> float:
        """Tokens per target forward, bonus included (as our eval's AL): 1 + accepted / drafts."""
        return 1 + self.spec["accepted"] / self.spec["drafts"] if self.spec and self.spec["drafts"] else 1.0


def vllm_generate(
    target_dir: str | Path,
    prompts: list[list[int]],
    max_tokens: int,
    drafter_dir: str | Path | None = None,
    kind: str | None = None,
    draft_length: int = 3,
    timeout: float = 900,
) -> VLLMRun:
    """Greedy generation in vLLM (fp32, on the CPU), with our export as its drafter when given.
    A refused export is a RuntimeError carrying vLLM's own last lines."""
    python = vllm_python()
    if python is None:
        raise FileNotFoundError("no vLLM environment: run `bash eval/engines/setup_vllm.sh`")
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file, out_file = Path(tmp) / "prompts.json", Path(tmp) / "out.json"
        prompts_file.write_text(json.dumps(prompts))
        command = [str(python), str(SCRIPT), "--target", str(target_dir), "--prompts", str(prompts_file)]
        command += ["--out", str(out_file), "--max-tokens", str(max_tokens)]
        if drafter_dir is not None:
            command += [
                "--drafter",
                str(drafter_dir),
                "--method",
                METHOD_BY_KIND[kind],
                "--k",
                str(draft_length),
            ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            lines = [line for line in (done.stdout + done.stderr).splitlines() if "Location" not in line]
            raise RuntimeError(
                f"vLLM refused {drafter_dir or target_dir} ({kind or 'no drafter'}):\n"
                + "\n".join(lines[-25:])
            )
        return VLLMRun(**json.loads(out_file.read_text()))
