"""Is the confidence head calibrated on REAL decoding? (SPEC.md section 4)

The built-in decoder runs a static chain of K drafts with the confidence head attached; each
round records its drafts' uncalibrated confidence logits and how many drafts verification
accepted (eval/decoder.py `Generation.confidence`). Per draft position j (1-based):
    predicted survival  a_j = Π_{i<=j} c_i        realised  accept_len >= j
and, before (T = 1) and after calibration (per-position temperatures), the ECE (equal-width
bins), the AUROC and the Brier score of a_j against the realised outcome, plus reliability
diagrams. The chain must be static: under an adaptive policy, whether position j is drafted
at all depends on c, so the rounds reaching j would be a biased sample.

Temperatures are fitted on rounds from one set of prompts (`fit_temperatures`, sequential
temperature scaling as in train/confidence.py) and the report is made on rounds from others.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eval.decoder import ChainDrafting, SpeculativeDecoder
from eval.policies import StaticDraftLength
from eval.verify import SamplingParams
from heads.calibration import ECE_BINS, CalibrationFit, expected_calibration_error, fit_calibration, survival

GREEDY = SamplingParams()
FIGURE_FILE = "confidence_reliability.png"
NOISE_DRAWS = 200  # outcome draws behind ece_if_calibrated


@dataclass
class DecodedRounds:
    """Chain rounds of real decoding, as the confidence head saw them."""

    logits: torch.Tensor  # float32 [N, K] uncalibrated; nan where the round drafted fewer than j + 1
    accepted: torch.Tensor  # int64 [N] drafts accepted (before any EOS cut)

    @property
    def draft_length(self) -> int:
        return self.logits.shape[1]

    @property
    def observed(self) -> torch.Tensor:
        """bool [N, K]: position j was drafted in that round."""
        return ~self.logits.isnan()

    @property
    def outcomes(self) -> torch.Tensor:
        """float [N, K]: the realised accept-prefix, accept_len >= j + 1."""
        positions = torch.arange(self.draft_length, device=self.accepted.device)
        return (self.accepted[:, None] > positions).float()


def collect_rounds(
    decoder: SpeculativeDecoder,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams = GREEDY,
    generator: torch.Generator | None = None,
) -> DecodedRounds:
    """Decode each prompt (token ids) with a static-chain decoder that has a confidence head."""
    drafting = decoder.drafting
    if decoder.confidence is None:
        raise ValueError("calibration needs a decoder built with confidence=<ConfidenceHead>")
    if not (isinstance(drafting, ChainDrafting) and isinstance(drafting.policy, StaticDraftLength)):
        raise ValueError(
            f"calibration needs ChainDrafting(StaticDraftLength(K)), got {drafting!r}: an adaptive "
            "draft length decides from the confidence which positions get drafted (a biased sample)"
        )
    draft_length = drafting.policy.max_draft_len
    logits, accepted = [], []
    for prompt in tqdm(prompts, desc="calibration decoding", unit="prompt", leave=False):
        for record in decoder.generate(prompt, max_new_tokens, sampling, generator).confidence:
            logits.append(
                torch.nn.functional.pad(
                    record.logits.float(), (0, draft_length - record.logits.numel()), value=math.nan
                )
            )
            accepted.append(record.accepted)
    if not logits:
        raise ValueError(
            f"{len(prompts)} prompts gave no drafted round: longer max_new_tokens or more prompts"
        )
    return DecodedRounds(torch.stack(logits).cpu(), torch.tensor(accepted))


def fit_temperatures(rounds: DecodedRounds) -> CalibrationFit:
    """Sequential temperature scaling on decoded rounds (ECE before/after is on these same rounds)."""
    return fit_calibration(rounds.logits.nan_to_num(0.0), rounds.outcomes, rounds.observed)


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half); nan with a single class."""
    labels = labels.bool()
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return math.nan
    _, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = (ends - (counts.double() - 1) / 2)[inverse]  # 1-based, ties share their mean rank
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def ece_if_calibrated(
    predicted: torch.Tensor, num_bins: int = ECE_BINS, draws: int = NOISE_DRAWS, seed: int = 0
) -> float:
    """The ECE a perfectly calibrated head would show on these rounds: the mean ECE of the same
    predictions [n] against outcomes drawn from them. On a few hundred rounds this floor is a
    few hundredths, which is why the report needs many rounds before an ECE goal means anything."""
    generator = torch.Generator().manual_seed(seed)
    predicted = predicted.double().cpu()
    outcomes = torch.bernoulli(predicted.expand(draws, -1), generator=generator)
    return float(expected_calibration_error(predicted.expand(draws, -1), outcomes, num_bins).mean())


def position_metrics(predicted: torch.Tensor, outcomes: torch.Tensor, num_bins: int = ECE_BINS) -> dict:
    """ECE (and its floor, `ece_if_calibrated`), AUROC and Brier of predicted survival [n]
    against realised outcomes [n] (0/1)."""
    predicted, outcomes = predicted.double(), outcomes.double()
    return {
        "ece": float(expected_calibration_error(predicted, outcomes, num_bins)),
        "ece_if_calibrated": ece_if_calibrated(predicted, num_bins),
        "auroc": auroc(predicted, outcomes),
        "brier": float((predicted - outcomes).square().mean()),
        "mean_predicted": float(predicted.mean()),
    }


def empty_panel_note(outcomes: torch.Tensor) -> str | None:
    """What a reliability panel without a curve to read means, from its rounds' outcomes [n]."""
    if outcomes.numel() == 0:
        return "no round drafted\nthis position"
    if not bool(outcomes.any()):
        return "no accepted drafts\nat this position"
    return None


def reliability_diagram(
    rounds: DecodedRounds, temperatures: Sequence[float], path: Path, num_bins: int = ECE_BINS
) -> Path:
    """One panel per position: observed accept rate against mean predicted survival per bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = rounds.draft_length
    columns = min(positions, 4)
    rows_of_panels = math.ceil(positions / columns)
    figure, axes = plt.subplots(
        rows_of_panels, columns, figsize=(3.2 * columns, 3.2 * rows_of_panels), squeeze=False
    )
    predictions = {"before": survival(rounds.logits), "after": survival(rounds.logits, temperatures)}
    outcomes, observed = rounds.outcomes, rounds.observed
    for position in range(positions):
        axis = axes[position // columns][position % columns]
        axis.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle="--")
        rows = observed[:, position]
        for label, predicted in predictions.items():
            values, truth = predicted[rows, position], outcomes[rows, position].double()
            bins = (values * num_bins).long().clamp(0, num_bins - 1)
            counts = torch.bincount(bins, minlength=num_bins)
            used = counts > 0
            mean_predicted = torch.bincount(bins, values, minlength=num_bins)[used] / counts[used]
            accept_rate = torch.bincount(bins, truth, minlength=num_bins)[used] / counts[used]
            ece = float(expected_calibration_error(values, truth, num_bins)) if rows.any() else math.nan
            axis.plot(mean_predicted, accept_rate, marker="o", markersize=3, label=f"{label} (ECE {ece:.3f})")
        axis.set(xlim=(0, 1), ylim=(0, 1), title=f"position {position + 1} (n={int(rows.sum())})")
        axis.set_xlabel("predicted survival")
        axis.set_ylabel("accepted")
        note = empty_panel_note(outcomes[rows, position])
        if note:
            axis.text(0.5, 0.5, note, ha="center", va="center", fontsize=9, color="dimgrey", wrap=True)
        axis.legend(fontsize=8, loc="upper left")
    for empty in range(positions, rows_of_panels * columns):
        axes[empty // columns][empty % columns].axis("off")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


def calibration_report(
    rounds: DecodedRounds, temperatures: Sequence[float], out_dir: Path, num_bins: int = ECE_BINS
) -> dict:
    """The eval report's calibration section (JSON-safe: nan -> None) and its PNG.

    {"draft_length", "rounds", "temperatures", "positions": [{"position", "rounds",
    "accept_rate", "before": {ece, ece_if_calibrated, auroc, brier, mean_predicted},
    "after": {...}}],
    "max_ece_before", "max_ece_after", "images": [png path]}
    """
    before, after = survival(rounds.logits), survival(rounds.logits, temperatures)
    outcomes, observed = rounds.outcomes, rounds.observed
    positions = []
    for position in range(rounds.draft_length):
        rows = observed[:, position]
        if not rows.any():
            continue
        truth = outcomes[rows, position]
        positions.append(
            {
                "position": position + 1,
                "rounds": int(rows.sum()),
                "accept_rate": float(truth.mean()),
                "before": position_metrics(before[rows, position], truth, num_bins),
                "after": position_metrics(after[rows, position], truth, num_bins),
            }
        )
    image = reliability_diagram(rounds, temperatures, Path(out_dir) / FIGURE_FILE, num_bins)
    return _json_safe(
        {
            "draft_length": rounds.draft_length,
            "rounds": rounds.logits.shape[0],
            "temperatures": [float(t) for t in temperatures],
            "positions": positions,
            "max_ece_before": max((p["before"]["ece"] for p in positions), default=math.nan),
            "max_ece_after": max((p["after"]["ece"] for p in positions), default=math.nan),
            "images": [str(image)],
        }
    )


def evaluate_calibration(
    decoder: SpeculativeDecoder,
    fit_prompts: Sequence[Sequence[int]],
    report_prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    out_dir: Path,
    sampling: SamplingParams = GREEDY,
    generator: torch.Generator | None = None,
) -> dict:
    """Fit the temperatures on decoding fit_prompts (none: keep the head's), set them on the
    decoder's confidence head, and report on decoding report_prompts (held out)."""
    confidence = decoder.confidence
    fitted = None
    if fit_prompts:
        fitted = fit_temperatures(collect_rounds(decoder, fit_prompts, max_new_tokens, sampling, generator))
        confidence.set_temperatures(fitted.temperatures)
    rounds = collect_rounds(decoder, report_prompts, max_new_tokens, sampling, generator)
    report = calibration_report(rounds, confidence.args.temperatures, out_dir)
    report["fitted_on_rounds"] = None if fitted is None else fitted.rounds
    return report
