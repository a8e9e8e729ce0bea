import pytest
import torch

from data.generation import BatchedGenerator, Completion, Request
from heads.target import CachedTarget
from kernels.tree_verify_reference import processed_probs
from tests.heads.test_target_forward import FAMILIES, FAMILY_IDS

STOP = 2


def hf_greedy(model, prompt: list[int], max_new_tokens: int, stop: int = STOP) -> tuple[list[int], bool]:
    """HF greedy `generate` alone: the reply (stop token excluded) and whether it was cut."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),  # else HF reads pad_token_id inside a prompt as padding
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    if stop in out:
        return out[: out.index(stop)], False
    return out, True


@pytest.mark.parametrize("refill_every", [1, 3], ids=["refill-at-once", "refill-every-3"])
@pytest.mark.parametrize("build", FAMILIES, ids=FAMILY_IDS)
def test_greedy_replies_equal_hf_generate_alone_with_refill_and_follow_ups(build, refill_every):
    """3 rows for 7 conversations of 2 turns: rows are refilled as replies end (at once, or
    waiting up to 3 steps for others, as on a GPU), a second turn reuses its row's cache for
    the shared prefix, and every reply is HF's own."""
    model = build()
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 128, (n,), generator=generator).tolist() for n in (3, 9, 5, 14, 2, 7, 11)]
    # Random models rarely pick a fixed token: stop at one this model does pick (3rd reply token).
    stop = hf_greedy(model, prompts[0], 3, stop=-1)[0][2]
    got: dict[tuple[int, int], Completion] = {}

    def follow_up(completion: Completion) -> Request | None:
        conversation, turn = completion.request.tag
        got[conversation, turn] = completion
        if turn == 1:
            return None
        # The next turn: everything so far, the stop token, then a new "user" token.
        prompt = completion.request.prompt + completion.tokens + [stop, 5 + conversation]
        return Request(prompt, 6, (conversation, 1))

    requests = (Request(p, 8 if i % 2 else 3, (i, 0)) for i, p in enumerate(prompts))
    batched = BatchedGenerator(
        CachedTarget(model),
        batch_size=3,
        max_len=64,
        stop_tokens=[stop],
        kv_bucket=16,
        refill_every=refill_every,
    )
    if refill_every > 1:
        batched.max_padding = None  # as on a GPU: rows starting together share one forward
    batched.run(requests, follow_up)
    assert sorted(got) == [(i, t) for i in range(7) for t in (0, 1)]
    for completion in got.values():
        request = completion.request
        assert (completion.tokens, completion.cut) == hf_greedy(
            model, request.prompt, request.max_new_tokens, stop
        )
    assert {c.cut for c in got.values()} == {True, False}  # both ends of a reply were exercised
    assert batched.prefills < len(got)  # turns that started in the same step shared a forward
    assert batched.generated_tokens == sum(len(c.tokens) + (not c.cut) for c in got.values())


def test_sampled_first_tokens_follow_the_processed_target_distribution():
    """Chi-square over 4,000 draws of one prompt's first token at T=0.8, top-p 0.9."""
    model = FAMILIES[0]()
    prompt = [5, 17, 33]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    expected = processed_probs(logits, 0.8, 0, 0.9)
    draws = []
    batched = BatchedGenerator(
        CachedTarget(model), 16, 16, stop_tokens=[], temperature=0.8, top_p=0.9, seed=0, kv_bucket=8
    )
    batched.run((Request(prompt, 1, i) for i in range(4000)), lambda c: draws.append(c.tokens[0]) and None)
    counts = torch.bincount(torch.tensor(draws), minlength=expected.numel()).float()
    assert counts[expected == 0].sum() == 0  # nothing outside the top-p set
    kept = expected > 0
    chi2 = ((counts[kept] - 4000 * expected[kept]) ** 2 / (4000 * expected[kept])).sum().item()
    dof = int(kept.sum()) - 1
    # 99.9% quantile of chi-square(dof), Wilson-Hilferty approximation.
    bound = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3
    assert chi2 < bound, (chi2, bound, dof)
    assert batched.generated_tokens == 4000


def test_requests_that_do_not_fit_are_refused_by_name():
    batched = BatchedGenerator(CachedTarget(FAMILIES[0]()), 2, 8, stop_tokens=[STOP])
    with pytest.raises(ValueError, match="request 'long': prompt of 6 tokens \\+ max_new_tokens=4 exceeds"):
        batched.run(iter([Request([4] * 6, 4, "long")]), lambda c: None)
