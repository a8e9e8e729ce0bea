"""The shipped replies a head trained on the first 640 H200 conversations never saw (session 21).

Writes, as JSONL: the H200 set's conversations after the first 640 (the shipped head's run took
the first 640), then the conversations of the later CPU sets (_more, _third, _fourth) whose id
the H200 set lacks (ShareGPT conversations it dropped or never reached). Ids stay unique; the
CPU sets' replies to prompts the H200 set holds are left out (near-duplicates of text the head
saw).

    python docs/study/unseen_replies.py outputs/s21/unseen.jsonl
"""

import gzip
import json
import sys
from pathlib import Path

ASSETS = Path("data/assets")
TRAINED_ON = 640  # heads/release/smollm2-135m-eagle3: data.max_conversations=640 of the H200 set


def read(name: str) -> list[dict]:
    with gzip.open(ASSETS / f"smollm2_sharegpt_replies{name}.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


h200 = read("_h200")
known = {row["id"] for row in h200}
rows = h200[TRAINED_ON:]
for name in ("_more", "_third", "_fourth"):  # the first CPU set would add 5
    rows += [row for row in read(name) if row["id"] not in known]
assert len({row["id"] for row in rows}) == len(rows), "a conversation id repeats"
with open(sys.argv[1], "w") as f:
    for row in rows:
        f.write(json.dumps({"id": row["id"], "messages": row["messages"]}, ensure_ascii=False) + "\n")
print(f"{len(rows)} conversations -> {sys.argv[1]}")
