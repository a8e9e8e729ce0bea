"""User turns of ShareGPT conversations [start, end) (normalised, in source order, as
data.skip_conversations / data.max_conversations select them) as a JSONL source to regenerate
short replies from; each record keeps a placeholder reply for regeneration to replace.

By default the first user turn of each conversation; with --later-turns every user turn after the
first, each as a prompt of its own (without the conversation before it: new prompts for short
replies once the first turns are spent), those shorter than 40 characters ("continue", "more")
left out and counted. Records whose id and prompt a shipped replies asset already holds, prompts
written once already and prompts of held-out chat (docs/study/heldout_chat.jsonl) are left out
(counted).

python docs/study/export_first_turns.py 7441 16000 outputs/s24/first_turns.jsonl smollm2_replies_short
python docs/study/export_first_turns.py 0 16000 outputs/s29/later_turns.jsonl --later-turns
"""

import gzip
import hashlib
import json
import sys
from collections import Counter

from data.packaged import REPO_ASSETS
from data.prepare import DataConfig, select_conversations
from data.tally import Tally

MIN_LATER_CHARS = 40  # shorter later turns lean on the conversation before them
HELDOUT = "docs/study/heldout_chat.jsonl"

args = [a for a in sys.argv[1:] if a != "--later-turns"]
later = "--later-turns" in sys.argv[1:]
start, end, out, *exclude = args
seen = set()
for name in exclude:
    with gzip.open(REPO_ASSETS[name], "rt") as f:
        for line in f:
            record = json.loads(line)
            seen.add((record["id"], record["messages"][0]["content"]))

with open(HELDOUT) as f:
    heldout = {turn for line in f for turn in json.loads(line)["turns"]}

tally = Tally()
left_out = Counter()
selection = DataConfig(
    sources=["sharegpt"], skip_conversations=int(start), max_conversations=int(end) - int(start)
)
written_prompts = set()
with open(out, "w") as f:
    for conv in select_conversations(selection, tally):
        users = [m for m in conv.messages if m["role"] == "user"]
        if not users:
            tally.drop("no user turn", conv.source)
        for turn, message in enumerate(users[1:] if later else users[:1], start=1 if later else 0):
            record_id = f"{conv.id}#u{turn}" if later else conv.id
            if (record_id, message["content"]) in seen:
                left_out["already shipped"] += 1
            elif later and len(message["content"].strip()) < MIN_LATER_CHARS:
                left_out[f"later turn under {MIN_LATER_CHARS} characters"] += 1
            elif message["content"] in heldout:
                left_out["a held-out chat prompt"] += 1
            elif message["content"] in written_prompts:
                left_out["prompt written already"] += 1
            else:
                written_prompts.add(message["content"])
                record = {"id": record_id, "messages": [message, {"role": "assistant", "content": "-"}]}
                f.write(json.dumps(record) + "\n")
digest = hashlib.sha256(open(out, "rb").read()).hexdigest()
print(
    f"{out}: {len(written_prompts)} prompts (sha256 {digest}); left out {dict(left_out)}; {tally.to_dict()}"
)
