"""Copy a head directory into heads/release/<name>/ with its float tensors in bf16 and a README."""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

src, name, readme = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
dst = Path("heads/release") / name
shutil.rmtree(dst, ignore_errors=True)
dst.mkdir(parents=True)
for f in src.iterdir():
    if f.suffix == ".safetensors":
        tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in load_file(f).items()}
        save_file(tensors, str(dst / f.name), metadata={"format": "pt"})
    elif f.suffix == ".json":
        shutil.copy(f, dst / f.name)
identity = json.loads((dst / "target.json").read_text())
identity["name"] = "smollm2-135m-instruct"
(dst / "target.json").write_text(json.dumps(identity, indent=2))
shutil.copy(readme, dst / "README.md")
print(sorted((p.name, p.stat().st_size) for p in dst.iterdir()))
