"""When to stop drafting a chain: the draft-length policy interface, its policies, and the
confidence-based score of draft-tree nodes.

The decoder calls `start_request` before a request, then per round: `start_round` with the
running context (False: draft nothing, the round is a plain target step), `should_continue`
after each drafted token with everything drafted so far in this round, `verify_count` once
drafting stops (how many of the drafts, a prefix, verification gets: drafting is paid by then,
verification is not), and
`end_round` with the drafts, how many were verified and how many verification accepted. It
never drafts more than `max_draft_len` (nor more than the tokens left to generate). What is
drafted and verified depends on draft-side values only, never on the target, so decoding
stays lossless whatever a policy decides. A policy that looks at values (not just the count)
must read the device once per draft step: that is the price of a dynamic draft length.

Policies with `needs_confidence` read `DraftStep.confidence`, the calibrated c_k of a
confidence head (heads/confidence.py) the decoder was given; the survival of draft j is
a_j = Π_{i<=j} c_i, the probability that verification accepts drafts 1..j. Those policies
also adapt: `RunningCorrection` shifts the confidences towards the acceptance this request
(and, as its prior, the earlier ones) actually gets, and `ExpectedGain` prices drafts at the
request's running rate.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

MAX_DRAFT_LEN = 64  # longer chains are never accepted whole; a larger K is a config error


@dataclass
class DraftStep:
    token: torch.Tensor  # [B] drafted token (target vocabulary id)
    token_prob: torch.Tensor  # [B] its draft probability (after logits processing; greedy: softmax)
    hidden: torch.Tensor  # [B, H] drafter hidden state the distribution came from
    confidence: torch.Tensor | None = None  # [B] calibrated c_k; None when the decoder has no confidence head


class DraftLengthPolicy:
    """The interface, with the defaults of a policy that drafts every round and verifies all
    it drafted; a policy overrides what it decides (`should_continue` always)."""

    max_draft_len: int
    needs_confidence: ClassVar[bool] = False  # the decoder refuses it without a confidence head
    name: ClassVar[str]  # eval.policy's spelling

    def describe(self) -> dict:
        """What a verdict, report or card quotes of this policy."""
        described = {"policy": self.name, "draft_length": self.max_draft_len}
        for name, key in (("threshold", "policy_threshold"), ("adapt_rate", "adapt_rate")):
            if getattr(self, name, None) is not None:
                described[key] = getattr(self, name)
        return described

    def start_request(self) -> None:
        pass

    def start_round(self, context_tokens: int) -> bool:
        return True

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        raise NotImplementedError

    def verify_count(self, steps: Sequence[DraftStep]) -> int:
        return len(steps)

    def end_round(self, steps: Sequence[DraftStep], verified: int, accepted: int) -> None:
        pass


def check_draft_len(max_draft_len: int) -> None:
    if not 1 <= max_draft_len <= MAX_DRAFT_LEN:
        raise ValueError(f"draft length K={max_draft_len}: must be in [1, {MAX_DRAFT_LEN}]")


@dataclass
class StaticDraftLength(DraftLengthPolicy):
    """Always K tokens (no device read)."""

    name: ClassVar[str] = "static"
    max_draft_len: int

    def __post_init__(self):
        check_draft_len(self.max_draft_len)

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        return len(steps) < self.max_draft_len


@dataclass
class DraftProbabilityThreshold(DraftLengthPolicy):
    """EAGLE-2's signal: keep drafting while the chain's draft probability (the product of the
    drafted tokens' probabilities, an estimate of its acceptance) stays above `threshold`."""

    name: ClassVar[str] = "draft_prob"
    max_draft_len: int
    threshold: float

    def __post_init__(self):
        check_draft_len(self.max_draft_len)
        if not 0 <= self.threshold < 1:
            raise ValueError(f"draft policy threshold={self.threshold}: must be in [0, 1)")

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        if len(steps) >= self.max_draft_len:
            return False
        chain_prob = torch.stack([step.token_prob for step in steps]).prod(dim=0)  # [B]
        return bool((chain_prob >= self.threshold).all())


# --- confidence policies ----------------------------------------------------------------

MAX_SHIFT = 4.0  # bound on the per-request log-odds correction: one odd request cannot silence the head
PROB_EPS = 1e-6  # confidences are clipped to [eps, 1 - eps] before taking log-odds


def _log_odds(probs: torch.Tensor) -> torch.Tensor:
    probs = probs.float().clamp(PROB_EPS, 1 - PROB_EPS)
    return probs.log() - (-probs).log1p()


def _confidences(steps: Sequence[DraftStep]) -> torch.Tensor:
    """The steps' calibrated confidences stacked: [k, B]."""
    if any(step.confidence is None for step in steps):
        raise ValueError(
            "a confidence policy got draft steps without confidence: give the decoder a confidence head"
        )
    return torch.stack([step.confidence for step in steps])


@dataclass
class RunningCorrection:
    """Per-request recalibration: a log-odds shift b, c' = σ(logit c + b), learnt online.

    After each round, one gradient step (size `rate`) of the Bernoulli log-likelihood of what
    verification revealed: drafts 1..accepted were accepted, draft accepted + 1 (if drafted)
    was rejected, later drafts are unobserved. A request whose drafts do better than the head
    predicts (repetitive code, say) gets longer drafts, and one that does worse shorter ones.
    Each request starts from the mean shift the earlier ones ended with (0 for the first): a
    bias every request shares (a head calibrated on greedy acceptance, decoding at T=1) is
    learnt once, not again in every request's first rounds. Everything stays on the device but
    that mean, read once per request. rate 0 turns it off.
    """

    rate: float
    shift: torch.Tensor | None = field(default=None, repr=False)  # [B]; None = the prior
    prior: float = 0.0  # the mean shift earlier requests ended with
    requests: int = 0  # how many ended with a shift

    def reset(self) -> None:
        """A new request: fold the last one's shift into the prior, start from the prior."""
        if self.shift is not None:
            self.requests += 1
            self.prior += (float(self.shift.mean()) - self.prior) / self.requests
        self.shift = None

    def apply(self, confidences: torch.Tensor) -> torch.Tensor:
        """confidences [..., B] -> corrected [..., B]."""
        if self.shift is None and self.prior == 0:
            return confidences.float()
        return torch.sigmoid(_log_odds(confidences) + (self.prior if self.shift is None else self.shift))

    def update(self, confidences: torch.Tensor, accepted: int) -> None:
        """confidences [k, B] of the round's drafts; accepted: how many verification accepted."""
        observed = min(accepted + 1, confidences.shape[0])
        if self.rate == 0 or observed == 0:
            return
        predicted = self.apply(confidences[:observed])  # [o, B]
        outcomes = (torch.arange(observed, device=predicted.device) < accepted).float()[:, None]
        step = self.rate * (outcomes - predicted).sum(dim=0)  # [B]
        shift = step + (self.prior if self.shift is None else self.shift)
        self.shift = shift.clamp(-MAX_SHIFT, MAX_SHIFT)


def check_adapt_rate(adapt_rate: float) -> None:
    if not 0 <= adapt_rate <= 1:
        raise ValueError(f"draft policy adapt_rate={adapt_rate}: must be in [0, 1]")


@dataclass
class ConfidenceThreshold(DraftLengthPolicy):
    """Keep drafting while the survival a_k = Π c_i of the chain so far stays above `threshold`:
    the confidence head's estimate of "every draft so far is accepted" in place of EAGLE-2's
    draft probability."""

    name: ClassVar[str] = "confidence"
    max_draft_len: int
    threshold: float
    adapt_rate: float = 0.05
    needs_confidence: ClassVar[bool] = True

    def __post_init__(self):
        check_draft_len(self.max_draft_len)
        check_adapt_rate(self.adapt_rate)
        if not 0 <= self.threshold < 1:
            raise ValueError(f"draft policy threshold={self.threshold}: must be in [0, 1)")
        self.correction = RunningCorrection(self.adapt_rate)

    def start_request(self) -> None:
        self.correction.reset()

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        if len(steps) >= self.max_draft_len:
            return False
        survival = self.correction.apply(_confidences(steps)).prod(dim=0)  # [B]
        return bool((survival >= self.threshold).all())

    def end_round(self, steps: Sequence[DraftStep], verified: int, accepted: int) -> None:
        if verified:
            self.correction.update(_confidences(steps[:verified]), accepted)


def check_cost(name: str, value: float, where: str = "") -> None:
    if not 0 <= value < math.inf:
        raise ValueError(f"draft policy {name}={value}{where}: must be a finite cost >= 0 (target steps)")


@dataclass(frozen=True)
class RoundPrices:
    """What drafting and verification cost at one context length, in target steps (ExpectedGain)."""

    alpha: float  # one drafter step
    beta_per_token: float = 0.0  # verification per draft, when there is no measured curve
    verify_costs: tuple[float, ...] | None = None  # verifying 0..K drafts, measured

    def check(self, max_draft_len: int, where: str = "") -> None:
        for name in ("alpha", "beta_per_token"):
            check_cost(name, getattr(self, name), where)
        if self.verify_costs is not None and (
            len(self.verify_costs) < max_draft_len + 1 or min(self.verify_costs) <= 0
        ):
            raise ValueError(
                f"draft policy verify_costs={list(self.verify_costs)}{where}: need {max_draft_len + 1} positive "
                "costs (verifying 0..K drafts, relative to one target step)"
            )


@dataclass
class ExpectedGain(DraftLengthPolicy):
    """Draft, and verify, only what pays for its cost (SPEC.md section 3).

    Cost, in target forward steps, of a round with D drafts of which V are verified:
        C(D, V) = verify(V) + beta_round + D * alpha,   verify(V) = 1 + V * beta_per_token
    (or the measured `verify_costs[V]`: the target forward over the root and V drafts, relative
    to a plain one-token step; CPUs are far from linear, SPEC.md section 7). alpha: one drafter
    step (the catch-up that yields draft 1 counts as one). Its expected yield: N(V) = 1 + Σ_{j<=V} a_j
    (the target's own token, plus each draft that survives). Plain decoding yields 1 per step, so a
    round beats it iff N > C: the SPEC's a > 1 + α + β.

    Rule. Rounds are renewal cycles, so the long-run rate is E[N] / E[C], and a stopping rule
    maximises it iff it maximises E[N - ρ* C] per round, ρ* being that best rate (Dinkelbach).
    Drafting: after k drafts (survival a_k, last conditional c_k), the later drafts are predicted
    to survive with â_j = a_k c_k^(j - k); drafting goes on iff some L in (k, K] has
        Σ_{k<j<=L} â_j  >  ρ (C(L, L) - C(k, k)),
    where ρ is the request's running rate (tokens per target step, starting from plain decoding's
    1), so what a draft must earn rises as the request proves speculation pays. With a linear cost
    this is â_{k+1} > ρ (alpha + beta_per_token): one more token's survival × 1 token against its
    marginal cost; a measured non-linear `verify_costs` is why the rule looks further ahead.
    Verifying: once drafting stops, the drafts are paid for; verification gets the prefix V <= D
    maximising Σ_{j<=V} a_j - ρ (verify(V) - verify(0)), which is V = 0, a plain target step,
    where even the first draft's survival does not pay for verifying it: where speculation should
    be switched off, it is, one round at a time.
    Probing: learning c_1 costs a drafter step, paid even when nothing is verified. After n
    drafting rounds in a row that verified nothing, the next min(2^(n-1), max_skip) rounds do not
    draft at all (plain steps; the drafter catches up on their tokens in one forward when it next
    drafts), so a request where drafts keep failing pays for a probe every max_skip + 1 rounds,
    and one whose drafts start paying again is noticed within that many rounds. A request probes
    its first round; n carries over from the request before.
    Context: what a round costs changes with the context it attends to. `by_context` holds the
    prices measured at several context lengths; each round is priced at the measured length
    nearest its running context (alpha, beta_per_token and verify_costs above are the prices
    until the first round, and the only ones without `by_context`).
    """

    name: ClassVar[str] = "expected_gain"
    max_draft_len: int
    alpha: float
    beta_per_token: float = 0.0
    beta_round: float = 0.0
    verify_costs: tuple[float, ...] | None = None
    adapt_rate: float = 0.05
    max_skip: int = 8  # 0: draft every round
    by_context: dict[int, RoundPrices] | None = None
    needs_confidence: ClassVar[bool] = True

    def __post_init__(self):
        check_draft_len(self.max_draft_len)
        check_adapt_rate(self.adapt_rate)
        if self.max_skip < 0:
            raise ValueError(f"draft policy max_skip={self.max_skip}: must be >= 0 rounds")
        check_cost("beta_round", self.beta_round)
        prices = RoundPrices(self.alpha, self.beta_per_token, self.verify_costs)
        for context, measured in {None: prices, **(self.by_context or {})}.items():
            measured.check(self.max_draft_len, "" if context is None else f" at context {context}")
        self._price(prices)
        self.correction = RunningCorrection(self.adapt_rate)
        # Drafting rounds in a row that verified nothing, carried across requests like the
        # correction: where drafts kept failing, a new request's failed first probe backs off
        # at once instead of probing its way up again (~4 probes per request).
        self._idle = 0
        self.start_request()

    def _price(self, prices: RoundPrices) -> None:
        self.alpha, self.beta_per_token = prices.alpha, prices.beta_per_token
        self.verify_costs = (
            None if prices.verify_costs is None else tuple(float(c) for c in prices.verify_costs)
        )

    def verify_cost(self, verified: int) -> float:
        """verify(V) in target steps."""
        if self.verify_costs is None:
            return 1 + verified * self.beta_per_token
        return self.verify_costs[verified]

    def round_cost(self, drafts: int, verified: int | None = None) -> float:
        """C(D, V) in target steps; V = D unless given."""
        verified = drafts if verified is None else verified
        return self.verify_cost(verified) + self.beta_round + drafts * self.alpha

    @property
    def rate(self) -> float:
        """This request's tokens per target step so far, one plain step as the prior."""
        return self._tokens / self._cost

    def start_request(self) -> None:
        self.correction.reset()
        self._tokens, self._cost = 1.0, 1.0
        self._skip = 0  # rounds left to skip: a request probes its first round

    def price_at(self, context_tokens: int) -> None:
        """Take the prices measured at the context nearest this one (no-op without by_context)."""
        if self.by_context:
            self._price(
                self.by_context[min(self.by_context, key=lambda measured: abs(measured - context_tokens))]
            )

    def start_round(self, context_tokens: int) -> bool:
        self.price_at(context_tokens)
        if self._skip:
            self._skip -= 1
            return False
        return True

    def should_continue(self, steps: Sequence[DraftStep]) -> bool:
        drafted = len(steps)
        if drafted >= self.max_draft_len:
            return False
        corrected = self.correction.apply(_confidences(steps))  # [k, B]
        # The step's one device read: the chain's survival and its last conditional (worst row).
        survival, last = torch.stack([corrected.prod(dim=0).min(), corrected[-1].min()]).tolist()
        rate, base_cost = self.rate, self.round_cost(drafted)
        gain, predicted = 0.0, survival
        for length in range(drafted + 1, self.max_draft_len + 1):
            predicted *= last
            gain += predicted
            if gain > rate * (self.round_cost(length) - base_cost):
                return True
        return False

    def verify_count(self, steps: Sequence[DraftStep]) -> int:
        if not steps:
            return 0
        corrected = self.correction.apply(_confidences(steps))  # [k, B]
        return self.best_prefix(corrected.cumprod(dim=0).min(dim=1).values.tolist())  # worst row, one read

    def best_prefix(self, survivals: Sequence[float]) -> int:
        """V maximising Σ_{j<=V} a_j - ρ (verify(V) - verify(0)) for drafts already paid for
        (survivals a_1, a_2, ...); 0 when none pays for its verification."""
        rate, best, best_value, gain = self.rate, 0, 0.0, 0.0
        for verified, survival in enumerate(survivals, start=1):
            gain += survival
            value = gain - rate * (self.verify_cost(verified) - self.verify_cost(0))
            if value > best_value:
                best, best_value = verified, value
        return best

    def count_round(self, tokens: int, cost: float) -> None:
        """A round's yield and cost (target steps) into the request's running rate."""
        self._tokens += tokens
        self._cost += cost

    def end_round(self, steps: Sequence[DraftStep], verified: int, accepted: int) -> None:
        self.count_round(accepted + 1, self.round_cost(len(steps), verified))
        if verified:
            self.correction.update(_confidences(steps[:verified]), accepted)
            self._idle = 0
        elif steps:
            self._idle += 1
            self._skip = min(2 ** (self._idle - 1), self.max_skip)


def expected_gain_from_costs(max_draft_len: int, costs: dict, adapt_rate: float = 0.05) -> ExpectedGain:
    """An ExpectedGain priced by eval/run.py's `measure_costs` of a chain, at the headline context
    and at every context under `costs["buckets"]` (each round at the one nearest its own)."""
    by_context = {
        int(context): round_prices(max_draft_len, bucket)
        for context, bucket in costs.get("buckets", {}).items()
    }
    headline = round_prices(max_draft_len, costs)
    return ExpectedGain(
        max_draft_len,
        alpha=headline.alpha,
        beta_per_token=headline.beta_per_token,
        verify_costs=headline.verify_costs,
        adapt_rate=adapt_rate,
        by_context=by_context or None,
    )


def round_prices(max_draft_len: int, costs: dict) -> RoundPrices:
    """One context's measured costs as prices: its alpha is a whole drafting round (the catch-up
    and K = verify_tokens - 1 draft steps) over one plain step, so alpha / K per draft, the
    catch-up spread over the drafts; its verification the measured curve `verify_costs` when
    there is one for K >= max_draft_len, else linear in the drafts with beta / K per draft (beta:
    verifying K + 1 tokens minus one plain step, over one plain step)."""
    drafts = costs["verify_tokens"] - 1
    if drafts < 1:
        raise ValueError(
            f"costs measured with verify_tokens={costs['verify_tokens']}: need at least one draft"
        )
    curve = costs.get("verify_costs")
    return RoundPrices(
        alpha=max(costs["alpha"], 0.0) / drafts,
        beta_per_token=max(costs["beta"], 0.0) / drafts,
        verify_costs=tuple(curve[: max_draft_len + 1]) if curve and len(curve) > max_draft_len else None,
    )


# --- draft trees ---------------------------------------------------------------------------


def child_log_survival(
    confidence: torch.Tensor, child_log_probs: torch.Tensor, sampled: bool
) -> torch.Tensor:
    """log P(child i is the accepted one | its parent was accepted), per child of a tree node.

    confidence [n]: the calibrated c of the parent's children (shared by siblings: c reads the
    parent's state and token, not the child's); child_log_probs [n, k]: the children's draft
    log-probs, siblings in the order verification tries them. Returns [n, k], all <= 0, so a
    node's survival (its parent's plus this) never exceeds its parent's and budget pruning keeps
    the tree closed under ancestors.

    Greedy: the first child is the draft argmax, accepted with probability c; the rest share
    1 - c in proportion to their draft probabilities. Sampling: c (1 - c)^(i - 1), which depends on
    the rank only, never on the drawn token, and falls with the rank: pruning by it keeps each
    node's children a prefix of their draw order, chosen without looking at the children it
    cuts, which is what keeps recursive rejection sampling exact (SPEC.md section 2).
    """
    conf = confidence.float().clamp(PROB_EPS, 1 - PROB_EPS)[:, None]  # [n, 1]
    if sampled:
        ranks = torch.arange(child_log_probs.shape[1], device=conf.device, dtype=torch.float32)
        scores = conf.log() + ranks * (-conf).log1p()  # [n, k]
        return torch.where(torch.isneginf(child_log_probs), -math.inf, scores)
    draft_probs = child_log_probs.float().exp()  # [n, k], best first
    share = (draft_probs[:, 1:] / (1 - draft_probs[:, :1]).clamp_min(1e-12)).clamp(max=1.0)
    factors = torch.cat([conf, (1 - conf) * share], dim=1)
    return factors.clamp_min(1e-30).log()
