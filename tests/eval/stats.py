"""Chi-square goodness of fit at alpha = 1e-4, and its power against a total-variation error."""

import math

import torch

ALPHA_Z = 3.719  # standard normal quantile of 1 - 1e-4


def chi_square_critical(dof: int) -> float:
    """Wilson-Hilferty approximation of the 1 - 1e-4 quantile of chi-square(dof)."""
    scale = 2 / (9 * dof)
    return dof * (1 - scale + ALPHA_Z * math.sqrt(scale)) ** 3


def power_against(tv: float, dof: int, draws: int) -> float:
    """Least power against any alternative at total variation tv: by Cauchy-Schwarz its
    noncentrality is >= draws * (2 tv)^2; noncentral chi-square in normal approximation."""
    noncentrality = draws * (2 * tv) ** 2
    mean, std = dof + noncentrality, math.sqrt(2 * (dof + 2 * noncentrality))
    return 0.5 * math.erfc((chi_square_critical(dof) - mean) / std / math.sqrt(2))


def chi_square(samples: torch.Tensor, exact: torch.Tensor) -> tuple[float, int]:
    """samples [N] cell ids, exact [cells] probabilities -> (statistic, degrees of freedom)."""
    counts = torch.bincount(samples, minlength=exact.numel()).double()
    possible = exact > 0
    assert counts[~possible].sum() == 0, "a continuation the target cannot produce was sampled"
    expected = exact[possible].double() * samples.numel()
    statistic = ((counts[possible] - expected) ** 2 / expected).sum().item()
    return statistic, int(possible.sum()) - 1
