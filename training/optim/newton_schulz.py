"""Newton-Schulz iterations that map a matrix to (approximately) its polar factor U V^T.

Muon replaces each weight matrix's update by its orthogonalised version. Each iteration is
the odd quintic ``X <- a X + b (X X^T) X + c (X X^T)^2 X`` on a batch of same-shape
matrices ([B, m, n]), so every head or expert of one shape costs one batched call.

Two coefficient schedules: Keller Jordan's fixed quintic (3.4445, -4.7750, 2.0315), which
drives singular values into roughly [0.7, 1.2] in 5 steps, and Polar Express (Amsel et
al. 2025, arXiv:2505.16932), per-step optimal coefficients that converge tighter around 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from training.optim.config import NewtonSchulzConfig


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
