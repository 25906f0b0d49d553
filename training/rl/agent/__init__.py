"""Agent harness: tool-using episodes through the OpenAI-compatible API (their record is
``training.rl.trajectory``)."""

from training.rl.agent.client import Completion, PolicyClient, PolicyResponseError, SamplingConfig
from training.rl.agent.episode import (
    EpisodeConfig,
    EpisodeResult,
    Policy,
    VersionGate,
    fixed_version,
    run_episode,
)
from training.rl.agent.sandbox import diff_trees, sandbox_copy
from training.rl.agent.tools import TOOL_NAMES, TOOL_SPECS, SandboxLimits, ToolBox, ToolOutcome

__all__ = [
    "TOOL_NAMES",
    "TOOL_SPECS",
    "Completion",
    "EpisodeConfig",
    "EpisodeResult",
    "Policy",
    "PolicyClient",
    "PolicyResponseError",
    "SamplingConfig",
    "SandboxLimits",
    "ToolBox",
    "ToolOutcome",
    "VersionGate",
    "diff_trees",
    "fixed_version",
    "run_episode",
    "sandbox_copy",
]
