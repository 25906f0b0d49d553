"""The trajectory record shared by rollout workers, the monitor and the trainer.

Every field the trainer needs to recompute the loss exactly is here: per turn the token
ids vLLM saw and produced, the logprobs it sampled them with and the policy version that
produced them. The record travels as JSON on a Redis Stream, hence pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    """One tool call the model made; ``arguments`` is the raw JSON text it produced."""

    call_id: str
    name: str
    arguments: str


class ToolResult(BaseModel):
    """What the harness answered to one call; ``ok`` is False for unknown tools and errors."""

    call_id: str
    name: str
    content: str
    ok: bool


class Turn(BaseModel):
    """One model call: exact prompt and completion token ids and sampling logprobs."""

    index: int
    policy_version: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    completion_text: str = ""
    finish_reason: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)


class Verdict(BaseModel):
    """A reward-hack monitor finding: which rule fired and the evidence that made it fire."""

    rule: str
    evidence: str


class Review(BaseModel):
    """A reviewer model's verdict on a suspicious episode (``training.rl.monitor.review``)."""

    verdict: Literal["hack", "clean", "undecided"]
    reason: str
    #: The reviewer model's name, and why the episode was reviewed.
    reviewer: str
    trigger: str


class FeedbackMark(BaseModel):
    """A turn where targeted text feedback applies, and the hint to insert there."""

    turn_index: int
    trigger: str
    hint: str


class TestOutcome(BaseModel):
    """Harness-owned test run: which FAIL_TO_PASS and PASS_TO_PASS tests passed."""

    __test__ = False  # not a pytest class

    fail_to_pass: dict[str, bool] = Field(default_factory=dict)
    pass_to_pass: dict[str, bool] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """A finished episode, as the rollout worker publishes it and the trainer consumes it."""

    trajectory_id: str
    rollout_id: str
    task_id: str
    environment: str
    policy_version_start: int
    policy_version_end: int
    turns: list[Turn]
    reward: float
    raw_reward: float
    tests: TestOutcome | None = None
    verdicts: list[Verdict] = Field(default_factory=list)
    #: The reviewer's verdict, for episodes the rules flagged or that earned fast.
    review: Review | None = None
    feedback: list[FeedbackMark] = Field(default_factory=list)
    invalid_tool_calls: int = 0
    tool_calls: int = 0
    ended_by: str = ""
