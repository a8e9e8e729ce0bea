"""Held-out chat prompts for the recipe study: first user turns of ShareGPT conversations
16,000-16,199 (never regenerated or trained on), at most 300 tokens, as an EvalPrompt JSONL."""

import json

from data.prepare import DataConfig, select_conversations
from data.tally import Tally
from heads.target import TargetConfig, load_tokenizer

tok = load_tokenizer(TargetConfig())
out = []
for conv in select_conversations(DataConfig(skip_conversations=16000, max_conversations=200), Tally()):
    first = next((m["content"] for m in conv.messages if m["role"] == "user"), None)
    if first and 8 <= len(tok(first).input_ids) <= 300:
        out.append({"task": "heldout_chat", "id": conv.id, "category": "chat", "turns": [first]})
with open("docs/study/heldout_chat.jsonl", "w") as f:
    for r in out[:48]:
        f.write(json.dumps(r) + "\n")
print(len(out), "eligible; wrote", min(48, len(out)))
