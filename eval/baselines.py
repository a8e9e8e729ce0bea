"""What a user would run instead of our decoder: Hugging Face `generate`, greedy or with
prompt-lookup decoding (the no-training alternative). Same prompts, same token budget.
"""

import time

import torch
from transformers import PreTrainedModel

from eval.decoder import GREEDY
from eval.verify import SamplingParams


@torch.no_grad()
def hf_generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # [1, T]
    max_new_tokens: int,
    eos_token_id: int | None,
    prompt_lookup_tokens: int = 0,  # 0 = plain decoding; > 0 = prompt-lookup decoding
    sampling: SamplingParams = GREEDY,
) -> tuple[list[int], float]:
    """New tokens (stopping at EOS) and wall-clock seconds, greedy or sampled like our decoder."""
    kwargs = {"prompt_lookup_num_tokens": prompt_lookup_tokens} if prompt_lookup_tokens else {}
    if not sampling.greedy:
        kwargs |= {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k or None,
        }
    start = time.perf_counter()
    out = model.generate(
        prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=max_new_tokens,
        do_sample=not sampling.greedy,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        **kwargs,
    )
    seconds = time.perf_counter() - start
    return out[0, prompt_ids.shape[1] :].tolist(), seconds
