"""The README's multi-node figures, from the code's own head classes: trainable parameters of a
fresh EAGLE-3 head (heads/eagle3.py, built on the meta device), the offline hidden-state cache
per token (data/hidden_cache.py: each target layer id plus the final norm output, [T, H] in the
target's dtype), and the optimizer-side memory per rank (fp32 weights 4 B + gradients 4 B +
AdamW moments 8 B per trainable parameter; ZeRO-2 shards the last 12 B over the ranks).

    .venv/bin/python docs/study/scaling_figures.py
"""

import torch
from transformers import LlamaConfig

from heads.draft_vocab import DraftVocab
from heads.eagle3 import Eagle3Head

TARGETS = {
    "SmolLM2-135M": (LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                 num_attention_heads=9, num_key_value_heads=3, vocab_size=49152), 16384),
    "Llama-3.1-8B": (LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256), 32000),
    "Llama-3.1-70B": (LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                  num_attention_heads=64, num_key_value_heads=8, vocab_size=128256), 32000),
}  # fmt: skip
RANKS = 16  # 2 nodes x 8 GPUs

print(
    "| target | draft vocab | trainable head params | hidden cache per 1M tokens (bf16) "
    f"| head + AdamW per rank: DDP | ZeRO-2 over {RANKS} ranks |"
)
print("|---|---|---|---|---|---|")
for name, (config, draft_vocab_size) in TARGETS.items():
    draft_vocab = DraftVocab.from_token_ids(torch.arange(draft_vocab_size), config.vocab_size)
    embed = torch.empty(config.vocab_size, config.hidden_size, device="meta")
    with torch.device("meta"):
        head = Eagle3Head.from_target(config, embed_weight=embed, draft_vocab=draft_vocab)
    params = sum(p.numel() for p in head.parameters() if p.requires_grad)
    cache = (len(head.args.target_layer_ids) + 1) * config.hidden_size * 2 * 1e6
    print(
        f"| {name} | {draft_vocab_size} | {params / 1e6:.1f} M | {cache / 1e9:.1f} GB "
        f"| {16 * params / 1e9:.2f} GB | {(4 + 12 / RANKS) * params / 1e9:.2f} GB |"
    )
