"""Muon's configuration: a leaf module, so every part of the optimizer can read it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

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


NewtonSchulzDtype = Literal["float32", "bfloat16", "float16"]
NewtonSchulzMethod = Literal["standard", "gram"]


@dataclass(frozen=True)
class NewtonSchulzConfig:
    """``schedule``: "quintic", "polar_express", or explicit per-step coefficients.

    The defaults (Gram Newton-Schulz in float16) and the evidence for them are in
    training.optim.newton_schulz's docstring.
    """

    schedule: str | tuple[Coefficients, ...] = field(
        default="quintic",
        metadata={
            "help": "Newton-Schulz coefficient schedule.",
            "flag": "ns_schedule",
            "choices": ("quintic", "polar_express"),
        },
    )
    steps: int = 5
    eps: float = 1e-7
    dtype: NewtonSchulzDtype = field(
        default="float16",
        metadata={"help": "Newton-Schulz working precision.", "flag": "ns_dtype"},
    )
    method: NewtonSchulzMethod = field(
        default="gram",
        metadata={
            "help": "Newton-Schulz on the matrix (standard) or on its Gram matrix (gram; "
            "square matrices fall back to standard).",
            "flag": "ns_method",
        },
    )
    # Gram Newton-Schulz starts afresh from the matrix before these steps (0-based): in half
    # precision the Gram matrix drifts from the iterate's (see newton_schulz.py).
    gram_restarts: tuple[int, ...] = (2,)

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


ScaleRule = Literal["spectral", "match_adamw"]
Owners = Literal["job", "shard_group"]


@dataclass
class MuonConfig:
    """Fields with ``help`` metadata are command-line options of ``cstack train``."""

    lr: float = field(default=0.02, metadata={"help": "Muon learning rate."})
    momentum: float = 0.95
    nesterov: bool = True
    weight_decay: float = field(default=0.0, metadata={"help": "Muon decoupled weight decay."})
    newton_schulz: NewtonSchulzConfig = field(default_factory=NewtonSchulzConfig)
    # spectral: max(1, rows/cols)^0.5; match_adamw: 0.2 * sqrt(max(rows, cols)), so that the
    # update's RMS matches AdamW's and AdamW learning rates carry over (Moonlight).
    scale_rule: ScaleRule = field(
        default="spectral", metadata={"help": "How each matrix's update is scaled."}
    )
    adamw_lr: float = field(
        default=3e-4, metadata={"help": "AdamW learning rate (embeddings, norms, router)."}
    )
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.0
    # Sharded Muon: how many groups may wait at each stage of their exchange (gathered,
    # returned, passed on) while others compute; 0: every exchange waits at once.
    max_in_flight: int = 2
    # job: each sharded matrix is orthogonalised once in the job, by the least-loaded rank
    # of all ranks (every rank busy; results travel to every replica). shard_group: each
    # replica of the dense weights orthogonalises its own copy inside its shard group.
    owners: Owners = field(
        default="job",
        metadata={"help": "Which ranks orthogonalise sharded matrices.", "flag": "muon_owners"},
    )
    # MuonClip's tau (Kimi K2): after each step, heads whose largest attention logit
    # exceeded it get their q/k weights scaled down to bring it to tau. On by default at
    # Kimi's 100 because the base model was trained under it and Muon is what lets logits
    # grow; a head below tau is never touched, so a healthy run only pays one small
    # all-reduce per step. Applied by the trainer (training.models.deepseek_v3.qk_clip).
    qk_clip_tau: float = field(
        default=100.0,
        metadata={"help": "QK-clip threshold on attention logits (MuonClip; 0: off)."},
    )
