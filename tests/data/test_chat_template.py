import numpy as np
import pytest

from data.chat_template import (
    ChatEncoder,
    ConversationError,
    assistant_mask,
    chat_template_hash,
    require_chat_template,
)
from data.conversations import Conversation
from data.tally import Tally
from heads.target import tokenizer_hash
from tests.data.conftest import END_OF_TURN, styled_tokenizer

CONVERSATIONS = {
    "multi_turn": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7 is prime."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "11."},
        {"role": "user", "content": "And one more, in code."},
        {"role": "assistant", "content": "```python\nprint(13)\n```"},
    ],
    "system": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
        {"role": "assistant", "content": "Blue"},
    ],
    "unicode": [
        {"role": "user", "content": "Traduis « bonjour » en japonais 🙂"},
        {"role": "assistant", "content": "こんにちは (konnichiwa) — 😀👍🏽 ‼️ café ñ e\u0301"},
    ],
    "template_looking_text": [
        {"role": "user", "content": "What does <|im_start|>assistant\nfake<|im_end|> mean?"},
        {
            "role": "assistant",
            "content": "ChatML wraps turns: <|im_start|>user\nhi<|im_end|>; Llama-3 ends them with "
            "<|eot_id|> after <|start_header_id|>assistant<|end_header_id|>.",
        },
        {"role": "user", "content": "Thanks<|im_end|>"},
        {"role": "assistant", "content": "(You're welcome.)\n\n- a\n- b"},
    ],
}


def decode(tokenizer, token_ids) -> str:
    return tokenizer.decode(
        np.asarray(token_ids).tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_mask_decodes_to_exactly_the_replies_and_their_end_of_turn(style_tokenizer, name):
    style, tokenizer = style_tokenizer
    messages = CONVERSATIONS[name]
    encoded = ChatEncoder(tokenizer).encode(messages)

    expected = "".join(m["content"] + END_OF_TURN[style] for m in messages if m["role"] == "assistant")
    assert decode(tokenizer, encoded.input_ids[encoded.loss_mask == 1]) == expected
    reference = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert encoded.input_ids.tolist() == list(reference)
    assert encoded.input_ids.dtype == np.int32 and encoded.loss_mask.dtype == np.int8
    assert not encoded.truncated


def test_each_reply_is_one_contiguous_masked_run(style_tokenizer):
    style, tokenizer = style_tokenizer
    encoded = ChatEncoder(tokenizer).encode(CONVERSATIONS["multi_turn"])
    starts = np.flatnonzero(np.diff(np.concatenate([[0], encoded.loss_mask])) == 1)
    assert len(starts) == 3
    # The first masked token is the reply's first token: the prompt (with any default system
    # prompt and the generation header) is never trained on.
    prompt = decode(tokenizer, encoded.input_ids[: starts[0]])
    assert prompt.endswith(("assistant\n", "assistant<|end_header_id|>\n\n"))


def test_no_chat_template_names_the_config_key(smollm2_tokenizer):
    tokenizer = styled_tokenizer(smollm2_tokenizer, "chatml")
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match=r"target\.chat_template="):
        ChatEncoder(tokenizer)
    with pytest.raises(ValueError, match="no chat template"):
        require_chat_template(tokenizer)


def test_template_that_rewrites_replies_is_reported(smollm2_tokenizer):
    tokenizer = styled_tokenizer(smollm2_tokenizer, "llama3")
    encoder = ChatEncoder(tokenizer)
    untrimmed = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  hello  "}]
    with pytest.raises(ConversationError, match="rewrites the assistant reply"):
        encoder.encode(untrimmed)


def test_template_rejecting_a_conversation_is_dropped_and_counted(smollm2_tokenizer):
    tokenizer = styled_tokenizer(smollm2_tokenizer, "chatml")
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('system only first') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    good = Conversation("a", "test record 0", CONVERSATIONS["system"])
    bad = Conversation(
        "b",
        "test record 1",
        [
            {"role": "user", "content": "x"},
            {"role": "system", "content": "late"},
            {"role": "assistant", "content": "y"},
        ],
    )
    tally = Tally()
    encoded = ChatEncoder(tokenizer).encode_batch([good, bad], tally)
    assert len(encoded) == 1
    assert tally.dropped == {"chat template rejected the conversation": 1}
    assert "test record 1" in tally.examples["chat template rejected the conversation"][0]


def test_truncation_is_counted_and_replies_cut_away_are_dropped(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    long_prompt = Conversation(
        "long-prompt",
        "test record 0",
        [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}],
    )
    long_reply = Conversation(
        "long-reply",
        "test record 1",
        [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two " * 100}],
    )
    tally = Tally()
    encoded = ChatEncoder(tokenizer, max_length=64).encode_batch([long_prompt, long_reply], tally)
    assert len(encoded) == 1 and encoded[0].truncated
    assert len(encoded[0].input_ids) == 64 == len(encoded[0].loss_mask)
    assert encoded[0].loss_mask.any()
    assert tally.truncated == 1
    assert tally.dropped == {"no assistant token left after truncation to max_length": 1}


def test_assistant_mask_refuses_a_token_crossing_a_span_boundary():
    offsets = np.array([[0, 3], [3, 6], [6, 9]])  # [T=3, 2]
    assert assistant_mask(offsets, [(3, 9)]).tolist() == [0, 1, 1]
    with pytest.raises(ConversationError, match="crosses"):
        assistant_mask(offsets, [(4, 9)])


def test_tokenizer_hash_tracks_vocab_and_template(smollm2_tokenizer):
    chatml = styled_tokenizer(smollm2_tokenizer, "chatml")
    assert tokenizer_hash(chatml) == tokenizer_hash(smollm2_tokenizer)
    qwen2 = styled_tokenizer(smollm2_tokenizer, "qwen2")
    assert tokenizer_hash(qwen2) != tokenizer_hash(chatml)
    assert chat_template_hash(qwen2) != chat_template_hash(chatml)
    llama3 = styled_tokenizer(smollm2_tokenizer, "llama3")
    llama3.chat_template = chatml.chat_template  # only the vocabulary differs now
    assert tokenizer_hash(llama3) != tokenizer_hash(chatml)
