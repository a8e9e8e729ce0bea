"""What a user would run instead of our decoder: Hugging Face `generate`, greedy or with
prompt-lookup decoding (the no-training alternative). Same prompts, same token budget.
"""

import time

import torch
from transformers import PreTrainedModel


@torch.no_grad()
def hf_generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [1, T]
    max_new_tokens: int,
    eos_token_id: int | None,
    prompt_lookup_tokens: int = 0,  # 0 = plain greedy; > 0 = prompt-lookup decoding
) -> tuple[list[int], float]:
    """New tokens (greedy, stopping at EOS) and wall-clock seconds."""
    kwargs = {"prompt_lookup_num_tokens": prompt_lookup_tokens} if prompt_lookup_tokens else {}
    start = time.perf_counter()
    out = model.generate(
        prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        **kwargs,
    )
    seconds = time.perf_counter() - start
    return out[0, prompt_ids.shape[1] :].tolist(), seconds
