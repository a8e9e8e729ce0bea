"""Ship regenerated replies: data/assets/<name>.jsonl.gz + <name>.json, the manifest of how they
were made (data/packaged.py REPO_ASSETS names each file for data.sources).

    python docs/study/make_asset.py <merged regenerated dir> <name> "<the command that made it>"
"""

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

src, name, command = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
out = Path("data/assets")
out.mkdir(parents=True, exist_ok=True)
dst = out / f"{name}.jsonl.gz"
data = (src / "conversations.jsonl").read_bytes()
with gzip.GzipFile(dst, "wb", mtime=0) as f:
    f.write(data)
manifest = json.loads((src / "manifest.json").read_text())
manifest["counts"].pop("examples", None)  # paths of this machine's install, not of the shipped data
manifest["shipped"] = {
    "file": dst.name,
    "sha256_uncompressed": hashlib.sha256(data).hexdigest(),
    "commit_made_at": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip(),
    "command": command,
}
(out / f"{name}.json").write_text(json.dumps(manifest, indent=2) + "\n")
print(dst, dst.stat().st_size, "bytes;", manifest.get("counts"))
