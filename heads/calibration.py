"""Calibration maths of the confidence head (SPEC.md section 4): ECE, survival, sequential
temperature scaling.

One temperature per draft position, fitted left to right to minimise the ECE of the cumulative
survival a_j = prod_{i<=j} sigma(logit_i / T_i). Training fits them on its held-out proxy
(train/confidence.py), eval on real decoding (eval/calibration.py); both call this module.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ECE_BINS = 15
# Candidate calibration temperatures: log-spaced 0.05 .. 20, symmetric around (and including) 1.
TEMPERATURE_GRID = torch.logspace(math.log10(0.05), math.log10(20.0), 241, dtype=torch.float64)


def expected_calibration_error(
    predicted: torch.Tensor, outcomes: torch.Tensor, num_bins: int = ECE_BINS
) -> torch.Tensor:
    """ECE with equal-width bins: Σ_bins |Σ outcomes - Σ predicted| / n.

    predicted, outcomes [..., n] (outcomes in [0, 1], soft allowed) -> [...]; batched over the
    leading dims so a grid of temperatures is scored at once. nan when n == 0.
    """
    bins = (predicted * num_bins).long().clamp(0, num_bins - 1)
    gap = torch.zeros(*predicted.shape[:-1], num_bins, dtype=torch.float64, device=predicted.device)
    gap.scatter_add_(-1, bins, (outcomes - predicted).double())
    return gap.abs().sum(-1) / predicted.shape[-1]


def survival(logits: torch.Tensor, temperatures: Sequence[float] | None = None) -> torch.Tensor:
    """Cumulative survival a_j = Π_{i<=j} σ(logits_i / T_i): logits [N, K] -> [N, K] (float64).

    temperatures None = uncalibrated; positions past the last temperature reuse it.
    """
    scaled = logits.double()
    if temperatures:
        per_position = [temperatures[min(j, len(temperatures) - 1)] for j in range(logits.shape[-1])]
        scaled = scaled / torch.tensor(per_position, dtype=torch.float64, device=logits.device)
    return torch.sigmoid(scaled).cumprod(dim=-1)


def fit_sequential_temperatures(
    logits: torch.Tensor,
    outcomes: torch.Tensor,
    observed: torch.Tensor,
    num_bins: int = ECE_BINS,
) -> list[float]:
    """Per-position temperatures, left to right, each minimising the ECE of the cumulative
    survival at its position given the temperatures already fitted before it.

    logits [N, K] uncalibrated; outcomes [N, K] realised survival (accept_len >= j + 1, or a
    product of soft labels); observed bool [N, K], a prefix per row (position j was drafted).
    Ties (ECE is piecewise constant in T) go to the temperature closest to 1. A position with
    no observed row keeps the previous temperature.
    """
    if logits.shape != outcomes.shape or logits.shape != observed.shape or logits.dim() != 2:
        raise ValueError(
            f"logits {tuple(logits.shape)}, outcomes {tuple(outcomes.shape)} and observed "
            f"{tuple(observed.shape)} must all be [rounds, positions]"
        )
    grid = TEMPERATURE_GRID.to(logits.device)
    closeness = grid.log().abs()  # tie-break: prefer T near 1
    temperatures: list[float] = []
    previous = torch.ones(logits.shape[0], dtype=torch.float64, device=logits.device)
    for position in range(logits.shape[1]):
        rows = observed[:, position]
        fitted = temperatures[-1] if temperatures else 1.0
        if bool(rows.any()):
            candidates = previous[rows] * torch.sigmoid(
                logits[rows, position].double() / grid[:, None]
            )  # [G, n]
            ece = expected_calibration_error(candidates, outcomes[rows, position].double()[None], num_bins)
            best = (ece - ece.min()).le(1e-12)
            fitted = float(grid[torch.where(best, closeness, math.inf).argmin()])
        temperatures.append(fitted)
        previous = previous * torch.sigmoid(logits[:, position].double() / fitted)
    return temperatures


@dataclass
class CalibrationFit:
    temperatures: list[float]
    ece_before: list[float]  # per position, on the data it was fitted on
    ece_after: list[float]
    rounds: list[int]  # observed chains per position

    def __str__(self) -> str:
        """One log line, rounded, saying what a temperature at an edge of the grid means."""
        low, high = float(TEMPERATURE_GRID[0]), float(TEMPERATURE_GRID[-1])
        line = "T by draft position " + ", ".join(f"{t:.2f}" for t in self.temperatures)
        line += " (chains " + ", ".join(str(n) for n in self.rounds) + "; ECE "
        line += ", ".join(f"{b:.3f}->{a:.3f}" for b, a in zip(self.ece_before, self.ece_after)) + ")"
        if any(math.isclose(t, high) for t in self.temperatures):
            line += (
                f"; T={high:g} is the grid's top (clamped): that position's confidence is flattened to 1/2, "
                "its logits did not help (too few chains, or no signal)"
            )
        if any(math.isclose(t, low) for t in self.temperatures):
            line += f"; T={low:g} is the grid's bottom (clamped): sharpened as far as the fit allows"
        return line


def fit_calibration(logits: torch.Tensor, outcomes: torch.Tensor, observed: torch.Tensor) -> CalibrationFit:
    """Fit the temperatures and report the ECE per position before and after (same data)."""
    temperatures = fit_sequential_temperatures(logits, outcomes, observed)
    before, after = survival(logits), survival(logits, temperatures)
    ece_before, ece_after, counts = [], [], []
    for position in range(logits.shape[1]):
        rows = observed[:, position]
        target = outcomes[rows, position].double()
        ece_before.append(float(expected_calibration_error(before[rows, position], target)))
        ece_after.append(float(expected_calibration_error(after[rows, position], target)))
        counts.append(int(rows.sum()))
    return CalibrationFit(temperatures, ece_before, ece_after, counts)
