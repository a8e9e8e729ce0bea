"""Reuse regenerated rows under data.skip_conversations: copy rows first..last-1 of one
regeneration directory (skip 0) into another's part file as rows 0..last-first-1, so a run
with data.skip_conversations=<first> data.max_conversations=<last-first> merges them instead
of generating them again (regeneration checks each row's id and source before using it).
Run it with no regeneration writing into <from dir>: reading the parts (data.regenerate.read_parts)
truncates a line cut short, as a resumed run does.

    python docs/study/shift_rows.py <from dir> <to dir> <first> <last>
"""

import json
import sys
from pathlib import Path

from data.regenerate import read_parts

src, dst, first, last = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = read_parts(src)
missing = [i for i in range(first, last) if i not in rows]
if missing:
    sys.exit(f"{src}: {len(missing)} of rows {first}-{last - 1} not regenerated yet (first: {missing[0]})")
dst.mkdir(parents=True, exist_ok=True)
with open(dst / "part-shifted.jsonl", "w") as f:
    for i in range(first, last):
        f.write(json.dumps(rows[i] | {"index": i - first}, ensure_ascii=False) + "\n")
print(f"{last - first} rows ({first}-{last - 1} of {src}) written to {dst / 'part-shifted.jsonl'}")
