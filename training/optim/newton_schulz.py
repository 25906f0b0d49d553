"""Newton-Schulz iterations that map a matrix to (approximately) its polar factor U V^T.

Muon replaces each weight matrix's update by its orthogonalised version. Each iteration is
the odd quintic ``X <- a X + b (X X^T) X + c (X X^T)^2 X = p(X X^T) X`` on a batch of
same-shape matrices ([B, m, n], iterated in the wide orientation m <= n), so every head or
expert of one shape costs one batched call.

Two coefficient schedules: Keller Jordan's fixed quintic (3.4445, -4.7750, 2.0315), which
drives singular values into roughly [0.7, 1.2] in 5 steps, and Polar Express (Amsel et
al. 2025, arXiv:2505.16932), per-step optimal coefficients that converge tighter around 1.

Gram Newton-Schulz (Zhang, Amsel, Chen, Dao 2026) computes the same iterate from the small
m x m Gram matrix. Every ``p`` is a polynomial in ``R0 = X0 X0^T``, so the iterate after t
steps is ``Q_t X0`` with ``Q_t = p_t(R_t) Q_{t-1}``, and the next Gram matrix is
``R_{t+1} = P R_t P`` with ``P = p_t(R_t)``: only m x m products until the last
``Q X0``. Per matrix that is ``8 m^2 n + 28 m^3`` FLOPs for 5 steps with one restart
against ``20 m^2 n + 10 m^3``: 30% fewer at the experts' aspect 3.5, more for flatter
matrices, none for square ones, which fall back to the standard iteration (``flops`` picks
whichever is cheaper, and the code follows it). The Gram matrix squares the condition
number, so in half precision it drifts from the iterate's: restarting (``X <- Q X``,
``R <- X X^T``, ``Q <- I``) before step ``gram_restarts`` keeps it honest; without the
restart the error against float32 grows 7x in float16 and past 100% in bfloat16 (measured
on [128, 512]: 0.03 -> 0.20 and 0.23 -> 4.3).

Precision. Input is normalised in float32 (momentum entries can be far below float16's
range), then cast to the working dtype. Measured against the float32 iteration on
gradient-like matrices (rank 32 plus 5% noise), cosine of the results: bfloat16 standard
0.98, bfloat16 Gram 0.92-0.95, float16 standard 0.9997, float16 Gram 0.999. A GPU runs both
half types at the same tensor-core rate, so float16 Gram is the default; the per-shape
bounds are in tests/training/optim/test_newton_schulz.py and the training comparison in
bench/RESULTS.md.

On CPU torch has no fast float16 matrix product (10-20x slower than float32 here), so there
each product of a half-precision iteration is computed in float32 and rounded to the
working dtype: what tensor cores do (half inputs, float32 accumulation, half output).
"""

from __future__ import annotations

import torch
from torch import Tensor

from training.optim.config import NewtonSchulzConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def orthogonalize(matrices: Tensor, config: NewtonSchulzConfig) -> Tensor:
    """Approximate polar factors of a batch ``[B, m, n]`` (float in, ``config.dtype`` out)."""
    if matrices.dim() != 3:
        raise ValueError(
            f"expected a batch of matrices [B, m, n], got shape {tuple(matrices.shape)}"
        )
    x = matrices.float()
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        # Iterate on the wide orientation: X X^T is then the smaller Gram matrix.
        x = x.mT
    norm = torch.linalg.matrix_norm(x, keepdim=True)  # Frobenius >= spectral norm
    x = (x / (norm * config.norm_safety + config.eps)).to(DTYPES[config.dtype])
    rows, cols = x.shape[-2:]
    if uses_gram(rows, cols, config):
        return _gram_iterate(x, config, transposed)
    return _standard_iterate(x, config, transposed)


def _products_in_float32(x: Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype != torch.float32


def _bmm(a: Tensor, b: Tensor) -> Tensor:
    if _products_in_float32(a):
        return torch.bmm(a.float(), b.float()).to(a.dtype)
    return torch.bmm(a, b)


def _baddbmm(c: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> Tensor:
    """``beta * c + alpha * (a @ b)``."""
    if _products_in_float32(a):
        out = torch.baddbmm(c.float(), a.float(), b.float(), beta=beta, alpha=alpha)
        return out.to(a.dtype)
    return torch.baddbmm(c, a, b, beta=beta, alpha=alpha)


# Both iterations end with a product by a symmetric matrix (a polynomial in X X^T), so a tall
# input's result is computed directly in its own orientation, (P X)^T = X^T P, and comes out
# contiguous without a transposing copy.


def _standard_iterate(x: Tensor, config: NewtonSchulzConfig, transposed: bool) -> Tensor:
    coefficients = config.coefficients()
    for step, (a, b, c) in enumerate(coefficients):
        gram = _bmm(x, x.mT)
        poly = _baddbmm(gram, gram, gram, beta=b, alpha=c)
        if transposed and step == len(coefficients) - 1:
            return _baddbmm(x.mT, x.mT, poly, beta=a, alpha=1.0)
        x = _baddbmm(x, poly, x, beta=a, alpha=1.0)
    return x.mT if transposed else x  # only with zero steps


def _gram_iterate(x: Tensor, config: NewtonSchulzConfig, transposed: bool) -> Tensor:
    coefficients = config.coefficients()
    gram = _bmm(x, x.mT)
    factor: Tensor | None = None  # Q: the product of the polynomials so far (None: I)
    for step, (a, b, c) in enumerate(coefficients):
        if step in config.gram_restarts and factor is not None:
            x = _bmm(factor, x)
            gram = _bmm(x, x.mT)
            factor = None
        poly = _baddbmm(gram, gram, gram, beta=b, alpha=c)  # b R + c R^2
        poly.diagonal(dim1=-2, dim2=-1).add_(a)  # + a I
        factor = poly if factor is None else _bmm(factor, poly)
        if step + 1 < len(coefficients) and step + 1 not in config.gram_restarts:
            gram = _bmm(_bmm(poly, gram), poly)
    assert factor is not None
    return _bmm(x.mT, factor) if transposed else _bmm(factor, x)


def standard_flops(rows: int, cols: int, steps: int) -> int:
    """Multiply-add FLOPs of ``steps`` standard iterations on one rows x cols matrix."""
    small, large = min(rows, cols), max(rows, cols)
    return steps * (4 * small * small * large + 2 * small**3)


def gram_flops(rows: int, cols: int, steps: int, restarts: tuple[int, ...]) -> int:
    """Multiply-add FLOPs of Gram Newton-Schulz, product by product as ``_gram_iterate``."""
    small, large = min(rows, cols), max(rows, cols)
    wide, square = 2 * small * small * large, 2 * small**3
    total, fresh = wide, True  # R0 = X X^T
    for step in range(steps):
        if step in restarts and not fresh:
            total += 2 * wide  # X <- Q X, R <- X X^T
            fresh = True
        total += square if fresh else 2 * square  # R^2, and Q P after the first
        fresh = False
        if step + 1 < steps and step + 1 not in restarts:
            total += 2 * square  # R <- P R P
    return total + wide  # Q X


def uses_gram(rows: int, cols: int, config: NewtonSchulzConfig) -> bool:
    """Gram Newton-Schulz when asked for and cheaper (not for square or nearly square)."""
    if config.method != "gram":
        return False
    gram = gram_flops(rows, cols, config.steps, config.gram_restarts)
    return gram < standard_flops(rows, cols, config.steps)


def flops(rows: int, cols: int, config: NewtonSchulzConfig) -> int:
    """Multiply-add FLOPs ``orthogonalize`` spends on one rows x cols matrix."""
    if uses_gram(rows, cols, config):
        return gram_flops(rows, cols, config.steps, config.gram_restarts)
    return standard_flops(rows, cols, config.steps)
