"""Ship the regenerated replies: data/assets/smollm2_sharegpt_replies.jsonl.gz + a manifest."""

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

src = Path(sys.argv[1])  # the merged regenerated dir
out = Path("data/assets")
out.mkdir(parents=True, exist_ok=True)
dst = out / "smollm2_sharegpt_replies.jsonl.gz"
data = (src / "conversations.jsonl").read_bytes()
with gzip.GzipFile(dst, "wb", mtime=0) as f:
    f.write(data)
manifest = json.loads((src / "manifest.json").read_text())
manifest["shipped"] = {
    "file": dst.name,
    "sha256_uncompressed": hashlib.sha256(data).hexdigest(),
    "commit_made_at": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip(),
    "command": sys.argv[2],
}
(out / "smollm2_sharegpt_replies.json").write_text(json.dumps(manifest, indent=2) + "\n")
print(dst, dst.stat().st_size, "bytes;", manifest.get("counts"))
