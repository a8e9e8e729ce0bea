"""Normalise raw records into clean, de-duplicated conversations.

Roles map onto user / assistant / system; messages of other roles, empty messages, and
messages that cannot be trained on (assistant turns before the first user turn, turns
after the last assistant reply) are dropped and counted. Conversations left without an
assistant reply, and exact duplicates, are dropped and counted too.
"""

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from data.sources import RawConversation
from data.tally import Tally

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}


@dataclass
class Conversation:
    id: str
    source: str  # where it came from: "<file or dataset> record <index>"
    messages: list[dict[str, str]]  # [{"role": user | assistant | system, "content": str}]


def normalise(raw: RawConversation, tally: Tally) -> Conversation | None:
    """The trainable form of one record, or None (counted in `tally`) when nothing is left."""
    if not raw.turns:
        tally.drop("empty conversation", raw.where)
        return None
    messages = []
    for raw_role, content in raw.turns:
        role = ROLES.get(raw_role.strip().lower())
        # Edge whitespace is noise, and templates that trim (Llama-3) would otherwise move
        # the assistant text away from where the loss mask expects it.
        content = content.strip()
        if role is None:
            tally.drop_message(f"unknown role {raw_role!r}", raw.where)
        elif not content:
            tally.drop_message("empty content", raw.where)
        elif role == "assistant" and not any(m["role"] == "user" for m in messages):
            # A reply with no prompt teaches nothing, and templates cannot render it as a prefix.
            tally.drop_message("assistant turn before the first user turn", raw.where)
        else:
            messages.append({"role": role, "content": content})
    last_reply = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last_reply is None:
        tally.drop("no assistant turn", raw.where)
        return None
    for _ in messages[last_reply + 1 :]:
        tally.drop_message("turn after the last assistant turn", raw.where)
    return Conversation(raw.id, raw.where, messages[: last_reply + 1])


def conversation_digest(messages: list[dict[str, str]]) -> bytes:
    return hashlib.sha256(json.dumps(messages, ensure_ascii=False).encode()).digest()


def normalise_all(raws: Iterable[RawConversation], tally: Tally) -> Iterator[Conversation]:
    """Normalise and de-duplicate (identical normalised turns count as one conversation)."""
    seen: set[bytes] = set()
    for raw in raws:
        conversation = normalise(raw, tally)
        if conversation is None:
            continue
        digest = conversation_digest(conversation.messages)
        if digest in seen:
            tally.duplicates += 1
            continue
        seen.add(digest)
        yield conversation
