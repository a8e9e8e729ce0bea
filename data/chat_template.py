"""Tokenise conversations with the target's chat template and an exact assistant-only loss mask.

The mask is built on characters, not on guessed token patterns: the template renders the
conversation as text, rendering the prefix before each assistant reply (all earlier
messages plus the generation prompt) tells where the reply starts, the reply and the
special end-of-turn token that follows it (`<|im_end|>`, `<|eot_id|>`, ...) form its span,
and a token is trained on iff its character span lies inside an assistant span. Decoding
the masked-in tokens therefore gives exactly the replies plus their end-of-turn tokens,
whatever the template (default system prompts, BOS, headers) puts around them.
"""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import jinja2
import numpy as np

from data.conversations import Conversation
from data.tally import Tally

PROBE = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
]


class ConversationError(ValueError):
    """One conversation that cannot be encoded; a batch drops it and counts `reason`."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class TokenisedConversation:
    input_ids: np.ndarray  # [T] int32
    loss_mask: np.ndarray  # [T] int8, 1 on assistant reply and end-of-turn tokens
    truncated: bool


def require_chat_template(tokenizer) -> str:
    template = tokenizer.chat_template
    if not isinstance(template, str) or not template:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} ({tokenizer.name_or_path!r}) has no chat template: "
            "set one with the config key target.chat_template=<Jinja template>"
        )
    return template


def generation_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat so far as the model reads it before writing its reply (with the generation prompt)."""
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def chat_template_hash(tokenizer) -> str:
    return hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()


def assistant_mask(offsets: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """1 for tokens whose characters lie inside an assistant span.

    offsets: [T, 2] character (start, end) per token, non-decreasing; spans: sorted, disjoint.
    Raises ConversationError when a token crosses a span boundary: no mask would be exact.
    """
    span_starts = np.array([start for start, _ in spans], dtype=np.int64)
    span_ends = np.array([end for _, end in spans], dtype=np.int64)
    token_starts, token_ends = offsets[:, 0], offsets[:, 1]
    boundaries = np.concatenate([span_starts, span_ends])
    # The last token starting before each boundary must end at or before it.
    before = np.searchsorted(token_starts, boundaries, side="left") - 1
    crossing = (before >= 0) & (token_ends[np.maximum(before, 0)] > boundaries)
    if crossing.any():
        raise ConversationError(
            "a token crosses an assistant-span boundary", f"at char {boundaries[crossing][0]}"
        )
    span_index = np.searchsorted(span_starts, token_starts, side="right") - 1
    inside = (span_index >= 0) & (token_ends <= span_ends[np.maximum(span_index, 0)])
    return inside.astype(np.int8)


def _located(source: str, detail: str) -> str:
    return f"{source}: {detail}" if detail else source


class ChatEncoder:
    """Encodes conversations for one tokenizer; checks once that the method fits its template."""

    def __init__(self, tokenizer, max_length: int | None = None):
        require_chat_template(tokenizer)
        self.tokenizer = tokenizer
        self.max_length = max_length
        specials = set(tokenizer.all_special_tokens)
        specials.update(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)
        self.special_tokens = sorted(specials, key=len, reverse=True)  # longest match first
        self._check_probe()

    def _check_probe(self) -> None:
        try:
            text, spans = self.render(PROBE)
            (input_ids,), (offsets,) = self._tokenise([text])
            assistant_mask(offsets, spans)
        except ConversationError as error:
            raise ValueError(
                f"chat template of {self.tokenizer.name_or_path!r} is not supported: {error}"
            ) from None
        reference = self.tokenizer.apply_chat_template(PROBE, tokenize=True, return_dict=False)
        if list(input_ids) != list(reference):
            raise ValueError(
                f"tokenising the rendered chat template of {self.tokenizer.name_or_path!r} differs from "
                "apply_chat_template(tokenize=True); the loss mask would not line up"
            )

    def _apply(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except jinja2.TemplateError as error:
            raise ConversationError("chat template rejected the conversation", str(error)) from None

    def _end_of_turn_at(self, text: str, pos: int) -> str | None:
        return next((token for token in self.special_tokens if text.startswith(token, pos)), None)

    def render(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The templated text and the (start, end) character span of each reply + end-of-turn."""
        text = self._apply(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prefix = self._apply(messages[:i], add_generation_prompt=True)
            if not text.startswith(prefix):
                raise ConversationError(
                    "chat template renders earlier turns differently once a reply follows", f"message {i}"
                )
            start = len(prefix)
            end = start + len(message["content"])
            if text[start:end] != message["content"]:
                raise ConversationError("chat template rewrites the assistant reply", f"message {i}")
            end_of_turn = self._end_of_turn_at(text, end)
            if end_of_turn is None:
                raise ConversationError(
                    "chat template puts no special end-of-turn token right after the reply", f"message {i}"
                )
            spans.append((start, end + len(end_of_turn)))
        return text, spans

    def _tokenise(self, texts: list[str]) -> tuple[list[list[int]], list[np.ndarray]]:
        encodings = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [np.asarray(o, dtype=np.int64).reshape(-1, 2) for o in encodings["offset_mapping"]]
        return encodings["input_ids"], offsets

    def _mask_and_truncate(
        self, input_ids: list[int], offsets: np.ndarray, spans: list[tuple[int, int]]
    ) -> TokenisedConversation:
        loss_mask = assistant_mask(offsets, spans)
        truncated = self.max_length is not None and len(input_ids) > self.max_length
        if truncated:
            input_ids, loss_mask = input_ids[: self.max_length], loss_mask[: self.max_length]
            if not loss_mask.any():
                raise ConversationError("no assistant token left after truncation to max_length")
        return TokenisedConversation(np.asarray(input_ids, dtype=np.int32), loss_mask, truncated)

    def encode(self, messages: list[dict[str, str]]) -> TokenisedConversation:
        """Encode one conversation; raises ConversationError when it cannot be trained on."""
        text, spans = self.render(messages)
        (input_ids,), (offsets,) = self._tokenise([text])
        return self._mask_and_truncate(input_ids, offsets, spans)

    def encode_batch(self, conversations: list[Conversation], tally: Tally) -> list[TokenisedConversation]:
        """Encode many at once (the fast tokenizer runs a batch on all cores); failures are counted."""
        rendered = []
        for conversation in conversations:
            try:
                rendered.append((conversation, *self.render(conversation.messages)))
            except ConversationError as error:
                tally.drop(error.reason, _located(conversation.source, error.detail))
        if not rendered:
            return []
        all_input_ids, all_offsets = self._tokenise([text for _, text, _ in rendered])
        results = []
        for (conversation, _, spans), input_ids, offsets in zip(rendered, all_input_ids, all_offsets):
            try:
                result = self._mask_and_truncate(input_ids, offsets, spans)
            except ConversationError as error:
                tally.drop(error.reason, _located(conversation.source, error.detail))
                continue
            tally.truncated += result.truncated
            results.append(result)
        return results
