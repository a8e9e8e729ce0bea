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


def transition_chi_square(sequences: list[list[int]], kernel: torch.Tensor) -> tuple[float, int, int]:
    """Pearson's test of a Markov chain's transition counts (Anderson & Goodman 1957).

    sequences: runs of tokens, each starting with its context token; kernel [V, V]: the exact
    P(next | current). -> (statistic, degrees of freedom, transitions). Each row of counts is
    compared with its own total times the kernel's row, so the dof are sum_a (cells_a - 1).
    """
    vocab = kernel.shape[0]
    counts = torch.zeros(vocab * vocab, dtype=torch.float64)
    for seq in sequences:
        pairs = torch.tensor(seq[:-1]) * vocab + torch.tensor(seq[1:])
        counts += torch.bincount(pairs, minlength=vocab * vocab).double()
    counts = counts.view(vocab, vocab)
    possible = kernel > 0
    assert counts[~possible].sum() == 0, "a transition the target cannot make was sampled"
    visited = counts.sum(dim=1) > 0
    expected = counts.sum(dim=1, keepdim=True) * kernel.double()
    cells = possible & visited.unsqueeze(1)
    statistic = ((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum().item()
    dof = int((possible.sum(dim=1) - 1)[visited].sum())
    return statistic, dof, int(counts.sum())
