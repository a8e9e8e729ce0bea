"""How many forwards regeneration runs per generated token, by `refill_every`: a replay of real
conversation shapes through data/generation.py on a tiny random model (2-core CPU, seconds).

On a GPU a forward of the embedded target costs ~25 ms of host time whatever its size
(BENCHMARKS.md, session 20), so the forward count, not the work, prices regeneration there.
The shapes are the shipped H200 replies' (data/assets/smollm2_sharegpt_replies_h200.jsonl.gz):
each turn's prompt length (the chat template over the turns so far) and reply length in tokens
of the embedded target's tokenizer. The tiny model stands in for the target: stop tokens are
off, so each reply runs exactly its recorded length; a later turn's prompt is the earlier
prompt, the reply the generator produced and the next user turn's tokens, so rows reuse their
cache as in a real regeneration.

    python docs/study/regen_forwards.py [--batch-size 1024] [--repeat 4] [--refill-every 1 8 16]
                                        [--prefill-tokens 8192]

--repeat queues the conversations that many times over, so that rows keep taking new ones (a
regeneration of thousands of conversations) rather than all fitting in the batch at once.
"""

import argparse
import gzip
import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from data.chat_template import generation_prompt_ids
from data.generation import BatchedGenerator, Completion, Request
from heads.target import CachedTarget, TargetConfig, load_tokenizer

REPLIES = Path(__file__).resolve().parents[2] / "data/assets/smollm2_sharegpt_replies_h200.jsonl.gz"
MAX_LENGTH = 1024  # data.max_length of the shipped run


def turn_shapes(tokenizer) -> list[list[tuple[int, int]]]:
    """Per conversation, per turn: (new prompt tokens since the last reply, reply tokens)."""
    conversations = []
    for line in gzip.open(REPLIES, "rt"):
        messages = json.loads(line)["messages"]
        turns, before = [], 0
        for j, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = len(generation_prompt_ids(tokenizer, messages[:j]))
            reply = (
                len(tokenizer(message["content"], add_special_tokens=False)["input_ids"]) + 1
            )  # + end of turn
            if prompt + 1 >= MAX_LENGTH:
                break
            turns.append((prompt - before, min(reply, MAX_LENGTH - prompt)))
            before = prompt + reply
        if turns:
            conversations.append(turns)
    return conversations


def count_forwards(
    model, conversations, batch_size: int, refill_every: int, prefill_tokens: int
) -> BatchedGenerator:
    """Replay every conversation's turns; the generator's counters hold the forwards run."""
    generator = BatchedGenerator(
        CachedTarget(model),
        batch_size,
        MAX_LENGTH + 1,
        stop_tokens=[],
        prefill_tokens=prefill_tokens,
        refill_every=refill_every,
    )
    generator.max_padding = None  # start rows as on a GPU: together whatever the padding

    def request(conversation: int, turn: int, before: list[int]) -> Request:
        new_tokens, reply = conversations[conversation][turn]
        user = [(conversation * 7 + turn * 13 + i) % 120 + 4 for i in range(new_tokens)]
        return Request(before + user, reply, (conversation, turn))

    def follow_up(completion: Completion) -> Request | None:
        conversation, turn = completion.request.tag
        if turn + 1 == len(conversations[conversation]):
            return None
        return request(conversation, turn + 1, completion.request.prompt + completion.tokens)

    generator.run((request(c, 0, []) for c in range(len(conversations))), follow_up)
    return generator


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--refill-every", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--prefill-tokens", type=int, default=8192)
    options = parser.parse_args()
    conversations = turn_shapes(load_tokenizer(TargetConfig())) * options.repeat
    turns = sum(len(c) for c in conversations)
    print(
        f"{len(conversations)} conversations, {turns} turns, batch {options.batch_size}, "
        f"<= {options.prefill_tokens} tokens per starting forward"
    )
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_LENGTH + 1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    print("refill_every | tokens | decode steps | starting forwards | forwards per 1k tokens")
    for refill_every in options.refill_every:
        g = count_forwards(model, conversations, options.batch_size, refill_every, options.prefill_tokens)
        forwards = g.steps + g.prefills
        print(
            f"{refill_every} | {g.generated_tokens:,} | {g.steps:,} | {g.prefills:,} | "
            f"{1000 * forwards / g.generated_tokens:.2f}"
        )


if __name__ == "__main__":
    main()
