"""The user turns of ShareGPT conversations 0-15,999 (normalised, in source order, as
data.max_conversations selects them) as a JSONL source for docs/study/gpu_recipe.sh, which
regenerates every assistant turn: those keep their place with a placeholder, so the file is
6.6 MB and travels to a device machine with the repository.

python docs/study/export_user_turns.py .xfer/sharegpt_user_turns_0_16000.jsonl.gz
"""

import gzip
import json
import sys

from data.prepare import DataConfig, select_conversations
from data.tally import Tally

tally = Tally()
with gzip.open(sys.argv[1], "wt") as f:
    for conv in select_conversations(DataConfig(sources=["sharegpt"], max_conversations=16000), tally):
        messages = [
            m if m["role"] != "assistant" else {"role": "assistant", "content": "-"} for m in conv.messages
        ]
        f.write(json.dumps({"id": conv.id, "messages": messages}, ensure_ascii=False) + "\n")
print(tally.to_dict())
