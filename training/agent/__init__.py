"""Agent harness: tool-using episodes through the OpenAI-compatible API, and their record."""

from training.agent.record import (
    FeedbackMark,
    TestOutcome,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
    Verdict,
)

__all__ = [
    "FeedbackMark",
    "TestOutcome",
    "ToolCall",
    "ToolResult",
    "Trajectory",
    "Turn",
    "Verdict",
]
