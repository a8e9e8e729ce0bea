"""The first user turn of ShareGPT conversations [start, end) (normalised, in source order, as
data.skip_conversations / data.max_conversations select them) as a JSONL source to regenerate
short replies from; each record keeps a placeholder reply for regeneration to replace. Records
whose id and first turn a shipped replies asset already holds are left out (counted).

python docs/study/export_first_turns.py 7441 16000 outputs/s24/first_turns.jsonl smollm2_replies_short
"""

import gzip
import hashlib
import json
import sys

from data.packaged import REPO_ASSETS
from data.prepare import DataConfig, select_conversations
from data.tally import Tally

start, end, out, *exclude = sys.argv[1:]
seen = set()
for name in exclude:
    with gzip.open(REPO_ASSETS[name], "rt") as f:
        for line in f:
            record = json.loads(line)
            seen.add((record["id"], record["messages"][0]["content"]))

tally = Tally()
selection = DataConfig(
    sources=["sharegpt"], skip_conversations=int(start), max_conversations=int(end) - int(start)
)
written, already_shipped = 0, 0
with open(out, "w") as f:
    for conv in select_conversations(selection, tally):
        first = next((m for m in conv.messages if m["role"] == "user"), None)
        if first is None:
            tally.drop("no user turn", conv.source)
        elif (conv.id, first["content"]) in seen:
            already_shipped += 1
        else:
            record = {"id": conv.id, "messages": [first, {"role": "assistant", "content": "-"}]}
            f.write(json.dumps(record) + "\n")
            written += 1
digest = hashlib.sha256(open(out, "rb").read()).hexdigest()
print(
    f"{out}: {written} first turns (sha256 {digest}); {already_shipped} already in {exclude}; {tally.to_dict()}"
)
