"""Tiny random models and tokenizers built inside the tests: no files, no hub."""

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 128) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: specials, then w0 w1 ... so any id decodes to something."""
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": len(vocab) + i for i in range(vocab_size - len(specials))})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def random_confidence_weights(head, scale: float) -> None:
    """Give a confidence head (which starts at zero) nn.Linear's random start, times scale."""
    bound = scale / head.linear.in_features**0.5
    with torch.no_grad():
        head.linear.weight.uniform_(-bound, bound)


def tiny_llama(num_layers: int = 2, vocab_size: int = 128, hidden_size: int = 32, seed: int = 0, **kw):
    """A random Llama with GQA (4 heads, 2 KV heads); fp32, eval mode."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=kw.pop("tie_word_embeddings", False),
        eos_token_id=2,
        pad_token_id=3,
        bos_token_id=1,
        **kw,
    )
    return LlamaForCausalLM(config).eval()
