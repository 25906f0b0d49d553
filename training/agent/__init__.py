"""Agent harness: tool-using episodes through the OpenAI-compatible API, and their record."""

from training.agent.client import Completion, PolicyClient, PolicyResponseError, SamplingConfig
from training.agent.episode import (
    EpisodeConfig,
    EpisodeResult,
    Policy,
    VersionGate,
    fixed_version,
    run_episode,
)
from training.agent.record import (
    FeedbackMark,
    TestOutcome,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
    Verdict,
)
from training.agent.sandbox import diff_trees, sandbox_copy
from training.agent.tools import TOOL_NAMES, TOOL_SPECS, SandboxLimits, ToolBox, ToolOutcome

__all__ = [
    "TOOL_NAMES",
    "TOOL_SPECS",
    "Completion",
    "EpisodeConfig",
    "EpisodeResult",
    "FeedbackMark",
    "Policy",
    "PolicyClient",
    "PolicyResponseError",
    "SamplingConfig",
    "SandboxLimits",
    "TestOutcome",
    "ToolBox",
    "ToolCall",
    "ToolOutcome",
    "ToolResult",
    "Trajectory",
    "Turn",
    "Verdict",
    "VersionGate",
    "diff_trees",
    "fixed_version",
    "run_episode",
    "sandbox_copy",
]
