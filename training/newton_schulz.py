"""Newton-Schulz iterations that map a matrix to (approximately) its polar factor U V^T.

Muon replaces each weight matrix's update by its orthogonalised version. Each iteration is
the odd quintic ``X <- a X + b (X X^T) X + c (X X^T)^2 X`` on a batch of same-shape
matrices ([B, m, n]), so every head or expert of one shape costs one batched call.

Two coefficient schedules: Keller Jordan's fixed quintic (3.4445, -4.7750, 2.0315), which
drives singular values into roughly [0.7, 1.2] in 5 steps, and Polar Express (Amsel et
al. 2025, arXiv:2505.16932), per-step optimal coefficients that converge tighter around 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Coefficients = tuple[float, float, float]

QUINTIC: Coefficients = (3.4445, -4.7750, 2.0315)

# Polar Express, degree 5, with the paper's 1.01 safety factor on all but the last step.
_POLAR_EXPRESS_RAW: tuple[Coefficients, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
POLAR_EXPRESS: tuple[Coefficients, ...] = (
    *((a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in _POLAR_EXPRESS_RAW[:-1]),
    _POLAR_EXPRESS_RAW[-1],
)


@dataclass(frozen=True)
class NewtonSchulzConfig:
    """``schedule``: "quintic", "polar_express", or explicit per-step coefficients."""

    schedule: str | tuple[Coefficients, ...] = "quintic"
    steps: int = 5
    eps: float = 1e-7

    def coefficients(self) -> list[Coefficients]:
        if isinstance(self.schedule, tuple):
            table: Sequence[Coefficients] = self.schedule
        elif self.schedule == "quintic":
            table = (QUINTIC,)
        elif self.schedule == "polar_express":
            table = POLAR_EXPRESS
        else:
            raise ValueError(
                f"unknown Newton-Schulz schedule {self.schedule!r} (quintic or polar_express)"
            )
        # Past the end of the table the last (converged) polynomial repeats.
        return [table[min(i, len(table) - 1)] for i in range(self.steps)]

    @property
    def norm_safety(self) -> float:
        # Polar Express assumes the spectral norm is at most 1 with a 1% margin.
        return 1.01 if self.schedule == "polar_express" else 1.0


def orthogonalize(matrices: Tensor, config: NewtonSchulzConfig) -> Tensor:
    """Approximate polar factors of a batch ``[B, m, n]`` (fp32 in, same dtype out)."""
    if matrices.dim() != 3:
        raise ValueError(
            f"expected a batch of matrices [B, m, n], got shape {tuple(matrices.shape)}"
        )
    x = matrices
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        # Iterate on the wide orientation: X X^T is then the smaller Gram matrix.
        x = x.mT
    norm = torch.linalg.matrix_norm(x, keepdim=True)  # Frobenius >= spectral norm
    x = x / (norm * config.norm_safety + config.eps)
    for a, b, c in config.coefficients():
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a, alpha=1.0)
    return x.mT if transposed else x


def flops(rows: int, cols: int, steps: int) -> int:
    """Multiply-add FLOPs of ``steps`` iterations on one rows x cols matrix."""
    small, large = min(rows, cols), max(rows, cols)
    per_step = 2 * small * small * large + 2 * small**3 + 2 * small * small * large
    return steps * per_step
