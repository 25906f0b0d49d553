"""How one parameter tensor splits into the matrices Muon orthogonalises.

Muon works best at the model's natural granularity: each attention head's slice of the q,
kv and output projections and each routed expert's matrices are separate linear maps, so
each is orthogonalised on its own rather than as one concatenated matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from torch import Tensor


class Split(Enum):
    WHOLE = "whole"  # [m, n] is one matrix
    ROW_BLOCKS = "row_blocks"  # [B*m, n]: block b is rows b*m:(b+1)*m (q_b_proj, kv_b_proj)
    COL_BLOCKS = "col_blocks"  # [m, B*n]: block b is columns b*n:(b+1)*n (o_proj)
    STACKED = "stacked"  # [B, m, n]: one matrix per leading index (routed experts)


@dataclass(frozen=True)
class MatrixLayout:
    split: Split
    blocks: int = 1

    def matrix_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        if self.split is Split.STACKED:
            return shape[1], shape[2]
        rows, cols = shape
        if self.split is Split.ROW_BLOCKS:
            return rows // self.blocks, cols
        if self.split is Split.COL_BLOCKS:
            return rows, cols // self.blocks
        return rows, cols

    def count(self, shape: tuple[int, ...]) -> int:
        return shape[0] if self.split is Split.STACKED else self.blocks

    def validate(self, name: str, shape: tuple[int, ...]) -> None:
        expected_dims = 3 if self.split is Split.STACKED else 2
        if len(shape) != expected_dims:
            raise ValueError(f"{name}: {self.split.value} needs a {expected_dims}-D tensor")
        if self.split is Split.ROW_BLOCKS and shape[0] % self.blocks:
            raise ValueError(f"{name}: {shape[0]} rows not divisible into {self.blocks} heads")
        if self.split is Split.COL_BLOCKS and shape[1] % self.blocks:
            raise ValueError(f"{name}: {shape[1]} columns not divisible into {self.blocks} heads")

    def pieces_view(self, tensor: Tensor) -> Tensor:
        """A view of a whole tensor, or of a dim-0 shard of one, whose row-major order is
        matrix by matrix: each matrix's rows held here, contiguous. Only column blocks need a
        transposed view ([rows, B*n] -> [B, rows, n]); every other layout is already so."""
        if self.split is Split.COL_BLOCKS:
            rows, cols = tensor.shape
            return tensor.view(rows, self.blocks, cols // self.blocks).transpose(0, 1)
        return tensor

    def to_matrices(self, tensor: Tensor) -> Tensor:
        """The [count, m, n] matrices of the full ``tensor`` (a copy for column blocks)."""
        m, n = self.matrix_shape(tuple(tensor.shape))
        return self.pieces_view(tensor).reshape(-1, m, n)


WHOLE = MatrixLayout(Split.WHOLE)
