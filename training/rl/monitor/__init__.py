"""Reward-hack monitor: deterministic rules over an episode's command log and diff."""

from training.rl.monitor.code_rules import (
    ALWAYS_TRUE_EQ,
    EXIT_OR_SKIP,
    REDEFINITION,
    SPECIAL_CASING,
    TEST_TAMPERING,
)
from training.rl.monitor.command_rules import (
    CACHE_OR_BYTECODE,
    DECOMPILER,
    NETWORK,
    SANDBOX_ESCAPE,
    VCS_HISTORY,
)
from training.rl.monitor.evidence import CommandEntry, EpisodeEvidence, FileChange
from training.rl.monitor.monitor import check_episode
from training.rl.monitor.scorer_rules import ANSWER_LOOKUP, REPORT_CHANNEL, SHADOWING_MODULE

RULES = (
    VCS_HISTORY,
    CACHE_OR_BYTECODE,
    DECOMPILER,
    TEST_TAMPERING,
    EXIT_OR_SKIP,
    ALWAYS_TRUE_EQ,
    SPECIAL_CASING,
    REDEFINITION,
    NETWORK,
    SANDBOX_ESCAPE,
    SHADOWING_MODULE,
    ANSWER_LOOKUP,
    REPORT_CHANNEL,
)

__all__ = [
    "ALWAYS_TRUE_EQ",
    "ANSWER_LOOKUP",
    "CACHE_OR_BYTECODE",
    "DECOMPILER",
    "EXIT_OR_SKIP",
    "NETWORK",
    "REDEFINITION",
    "REPORT_CHANNEL",
    "RULES",
    "SANDBOX_ESCAPE",
    "SHADOWING_MODULE",
    "SPECIAL_CASING",
    "TEST_TAMPERING",
    "VCS_HISTORY",
    "CommandEntry",
    "EpisodeEvidence",
    "FileChange",
    "check_episode",
]
