"""GRPO hyper-parameters and `cstack rl`'s session config; text feedback and its hint-KL
settings are ``training.rl.feedback``.

Nothing here imports torch: ``training.rl.learner.cli`` builds `cstack rl`'s options from
``SessionConfig`` when `cstack` starts.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from serving.settings import CstackSettings
from serving.vocabulary import REASONING_EFFORTS, VERBOSITIES
from training.rl.feedback import DEFAULT_FEEDBACK_FILE, TextFeedbackConfig
from training.rl.learner.curriculum import CurriculumConfig
from training.rl.rollouts.request import TaskStyle
from training.trainer.options import option

Normalisation = Literal["token", "sequence"]
#: How the policy gradient treats tokens the trainer's policy rates differently from the
#: engine that sampled them (training.rl.learner.losses.policy_surrogate).
Correction = Literal["tis", "clip"]
#: How new weights reach the engines after a step (training.rl.learner.loop.LoopConfig).
WeightTransport = Literal["stream", "disk"]


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative policy optimisation, corrected for the engine-trainer mismatch."""

    group_size: int = 4
    #: ``tis``: each token's gradient weighted by the truncated importance ratio
    #: min(p_trainer / p_sampler, tis_cap), detached; ``clip``: PPO's clipped ratio
    #: against the sampler's logprobs, which zeroes the gradient of a token whose ratio
    #: left [1 - clip_low, 1 + clip_high] on its advantage's side (above with A > 0,
    #: below with A < 0), mismatch or not, and leaves the other side unbounded.
    correction: Correction = "tis"
    tis_cap: float = 2.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    normalisation: Normalisation = "token"
    scale_by_std: bool = True
    std_eps: float = 1e-6
    max_staleness: int = 2
    feedback: TextFeedbackConfig = field(default_factory=TextFeedbackConfig)

    def __post_init__(self) -> None:
        if self.tis_cap < 1:
            raise ValueError(f"tis_cap is a ratio's ceiling, at least 1, not {self.tis_cap}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be at least 0, not {self.max_staleness}")


ENVIRONMENTS = ("digits", "toolchoice", "coding")


def default_task_ids(environment: str) -> tuple[str, ...]:
    """The tasks a run trains on when no ``--task`` is given (coding requires ``--task``)."""
    prefix = "tools" if environment == "toolchoice" else environment
    return tuple(f"{prefix}-{i}" for i in range(4))


def parse_task_styles(specs: Sequence[str], task_ids: Sequence[str]) -> dict[str, TaskStyle]:
    """``--task-style`` values, ``TASK=EFFORT[,VERBOSITY]`` (an empty EFFORT leaves it
    unsent), by task id; a ValueError names the first bad one in one line."""
    styles: dict[str, TaskStyle] = {}
    for spec in specs:
        task_id, equals, style = (part.strip() for part in spec.partition("="))
        knobs = [knob.strip() for knob in style.split(",")]
        if not equals or not task_id or len(knobs) > 2:
            raise ValueError(f"{spec!r} is not TASK=EFFORT[,VERBOSITY]")
        if task_id not in task_ids:
            raise ValueError(
                f"{spec!r}: {task_id!r} is not a task of this run ({', '.join(task_ids)})"
            )
        if task_id in styles:
            raise ValueError(f"{spec!r}: {task_id!r} already has a style")
        effort, verbosity = knobs if len(knobs) == 2 else (knobs[0], "")
        if effort and effort not in REASONING_EFFORTS:
            raise ValueError(
                f"{spec!r}: effort {effort!r} is not one of {', '.join(REASONING_EFFORTS)}"
            )
        if verbosity and verbosity not in VERBOSITIES:
            raise ValueError(
                f"{spec!r}: verbosity {verbosity!r} is not one of {', '.join(VERBOSITIES)}"
            )
        if not effort and not verbosity:
            raise ValueError(f"{spec!r} sets neither an effort nor a verbosity")
        styles[task_id] = TaskStyle.model_validate(
            {"reasoning_effort": effort or None, "verbosity": verbosity or None}
        )
    return styles


@dataclass(frozen=True)
class SessionConfig:
    """One local RL run (`cstack rl`): its options are the fields declared with help text."""

    steps: int = option(20, "Optimizer steps (each pushes new weights to vLLM).")
    weight_transport: WeightTransport = option(
        "stream", "How each step's weights reach vLLM: stream (in buckets over a process "
        "group the engines' workers join, no disk) or disk (an HF export they read back)."
    )  # fmt: skip
    environment: str = option(
        "digits", "The rollout environment; digits and toolchoice are learnable on CPU.",
        choices=ENVIRONMENTS,
    )  # fmt: skip
    task_ids: tuple[str, ...] = option(
        (), "Task ids (coding: folders in the task dir).", flag="task"
    )
    task_dir: Path = option(
        Path(".cstack/tasks"), "Where `cstack tasks build --out` wrote the coding tasks."
    )
    task_styles: tuple[str, ...] = option(
        (), "Per task: the reasoning effort and verbosity its rollouts ask the serving stack "
        "for, as TASK=EFFORT[,VERBOSITY], e.g. digits-0=low,high (repeatable; TASK=,VERBOSITY "
        "sends only the verbosity; tasks without one send neither). "
        f"EFFORT: {', '.join(REASONING_EFFORTS)}; VERBOSITY: {', '.join(VERBOSITIES)}.",
        flag="task_style",
    )  # fmt: skip
    group_size: int = option(4, "Rollouts per task per GRPO group.")
    groups_per_step: int = option(2, "Task groups per optimizer step.")
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    max_staleness: int = option(
        2, "Weight versions a rollout may lag and still be trained on; workers keep sampling "
        "while the trainer steps. 0: a synchronous loop (one step's groups queued at a "
        "time, trained only on the current weights).",
    )  # fmt: skip
    correction: Correction = option(
        "tis", "How the gradient treats tokens the engine sampled with other probabilities "
        "than the trainer's policy gives them: tis (weighted by their ratio, truncated at 2) "
        "or clip (PPO's clip: no gradient for a token whose ratio is over 1.2 with a "
        "positive advantage, or under 0.8 with a negative one).",
    )  # fmt: skip
    feedback: bool = option(True, "Targeted text feedback (hint KL).")
    #: Triggers, hints and the hint-KL coefficient (YAML); None: training/rl/feedback.yaml.
    feedback_config: Path | None = option(
        None,
        "Triggers, hints and hint-KL coefficient as YAML (default: training/rl/feedback.yaml).",
    )
    model: Path | None = option(None, "HF checkpoint to start from (default: tiny).")
    workers: int = option(1, "Rollout worker processes.")
    max_tokens: int = option(32, "Max tokens per model turn.")
    lr: float = option(
        0.005, "Muon learning rate (AdamW parts: lr / 10). 0.005: measured on toolchoice, "
        "the policy still reads hints there, so the hint-KL teacher stays a teacher (at "
        "0.02 RL erased it within 20 steps and text feedback hurt).",
    )  # fmt: skip
    mtp_loss_weight: float = option(
        0.0, "MTP loss weight, so that the fast engines' drafter follows the policy "
        "(DeepSeek-V3: 0.3, then 0.1); 0: the MTP layers are pushed as loaded.",
    )  # fmt: skip
    seed: int = option(0, "Seed of the trainer, the tiny checkpoint and rollout sampling.")
    metrics_port: int | None = option(
        None, "Serve trainer and staleness metrics here; workers use the next ports."
    )
    redis_url: str = option("", "Use this Redis instead of starting Valkey.")
    engine_urls: tuple[str, ...] = option(
        (), "Use these running vLLM engines (dev mode) instead of one.", flag="engine_url"
    )
    policy_url: str = option(
        "", "Rollouts call the policy here, e.g. the gateway's /v1 (key: CSTACK_RL_API_KEY)."
    )
    out: Path | None = option(
        None, "Weights, logs and the step report (default: rl/ in the state directory, "
        "CSTACK_STATE_DIR, where `cstack up` keeps its state).",
    )  # fmt: skip
    heartbeat_s: float = option(
        30.0, "Piped output (not a terminal): a line saying what still runs when nothing was "
        "printed for this many seconds (e.g. a step waiting for rollouts).",
    )  # fmt: skip
    #: Names this run's rollout queue and trajectory stream (not an option).
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def rollout_task_ids(self) -> tuple[str, ...]:
        """The tasks this run trains on: ``--task``, else the environment's defaults."""
        return self.task_ids or default_task_ids(self.environment)

    @property
    def styles(self) -> dict[str, TaskStyle]:
        """``task_styles`` parsed (ValueError when one is bad: the CLI checks first)."""
        return parse_task_styles(self.task_styles, self.rollout_task_ids)

    @property
    def out_dir(self) -> Path:
        """Where this run keeps its weights, logs and step report: ``out``, else ``rl/`` in
        the state directory every command shares (``CstackSettings.state_dir``)."""
        return self.out if self.out is not None else CstackSettings().state_dir / "rl"

    @property
    def feedback_file(self) -> Path:
        """The feedback YAML this run loads."""
        return self.feedback_config or DEFAULT_FEEDBACK_FILE
