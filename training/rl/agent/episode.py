"""One multi-turn, tool-using episode in a throwaway sandbox.

The harness, not the model, keeps the record: each turn's exact token ids, logprobs and
policy version, every command (tool call), every version of a file the sandbox held after
a call that can change it, and the final diff of the sandbox, all of which the reward-hack
monitor reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from training.rl.agent.client import Completion
from training.rl.agent.sandbox import VersionLog, diff_trees, sandbox_copy
from training.rl.agent.tools import TOOL_NAMES, TOOL_SPECS, SandboxLimits, ToolBox
from training.rl.agent.trees import TreeTooLarge
from training.rl.monitor import CommandEntry, FileChange
from training.rl.trajectory import TestOutcome, ToolResult, Turn

SYSTEM_PROMPT = (
    "You fix Python repositories. A feature was removed; implement it so the tests pass. "
    "Use the tools; call finish when done."
)
NUDGE = "Call one of the tools: " + ", ".join(TOOL_NAMES) + "."
#: The tools after which the sandbox's files may differ.
_CHANGES_TREE = ("write_file", "run_tests")


class Policy(Protocol):
    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion: ...


VersionGate = Callable[[], AbstractContextManager[int]]


def fixed_version(version: int) -> VersionGate:
    """A gate for runs without weight updates: every turn is ``version``."""

    @contextmanager
    def gate() -> Iterator[int]:
        yield version

    return gate


@dataclass(frozen=True)
class EpisodeConfig:
    max_turns: int = 8
    wall_time_s: float = 600.0
    system_prompt: str = SYSTEM_PROMPT
    limits: SandboxLimits = field(default_factory=SandboxLimits)


@dataclass
class EpisodeResult:
    turns: list[Turn]
    commands: list[CommandEntry]
    changes: list[FileChange]
    #: Versions of files seen during the episode other than the final ones.
    versions: list[FileChange]
    ended_by: str
    tool_calls: int
    invalid_tool_calls: int
    tests: TestOutcome | None


def _assistant_message(completion: Completion) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    if completion.tool_calls:
        message["tool_calls"] = [
            {"id": c.call_id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.tool_calls
        ]  # fmt: skip
    return message


def run_episode(
    policy: Policy,
    gate: VersionGate,
    template: Path,
    task_prompt: str,
    config: EpisodeConfig,
    python_paths: list[str] | None = None,
    evaluate: Callable[[Path], TestOutcome] | None = None,
    dependencies: list[str] | None = None,
) -> EpisodeResult:
    """Run until finish, ``max_turns`` or the wall-time limit; score before cleanup."""
    started = time.monotonic()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": config.system_prompt},
        {"role": "user", "content": task_prompt},
    ]
    turns: list[Turn] = []
    commands: list[CommandEntry] = []
    tool_calls = invalid = 0
    ended_by = "max_turns"
    with sandbox_copy(template) as root:
        tools = ToolBox(root, config.limits, python_paths or ["."], dependencies or [])
        log = VersionLog(template)
        for index in range(config.max_turns):
            if time.monotonic() - started > config.wall_time_s:
                ended_by = "wall_time"
                break
            with gate() as version:
                completion = policy.complete(messages, TOOL_SPECS)
            messages.append(_assistant_message(completion))
            results: list[ToolResult] = []
            finished = False
            for call in completion.tool_calls:
                tool_calls += 1
                invalid += call.name not in TOOL_NAMES
                outcome = tools.call(call.name, call.arguments)
                if call.name in _CHANGES_TREE:
                    log.record(root)
                commands.append(CommandEntry(tool=call.name, arguments=_arguments(call.arguments)))
                results.append(ToolResult(call_id=call.call_id, name=call.name,
                                          content=outcome.content, ok=outcome.ok))  # fmt: skip
                messages.append(
                    {"role": "tool", "tool_call_id": call.call_id, "content": outcome.content}
                )
                finished = finished or outcome.finished
            turns.append(Turn(
                index=index, policy_version=version,
                prompt_token_ids=completion.prompt_token_ids,
                completion_token_ids=completion.completion_token_ids,
                completion_logprobs=completion.logprobs, completion_text=completion.text,
                finish_reason=completion.finish_reason, tool_calls=completion.tool_calls,
                tool_results=results,
            ))  # fmt: skip
            if finished:
                ended_by = "finish"
                break
            if not completion.tool_calls:
                messages.append({"role": "user", "content": NUDGE})
        try:
            changes = [] if log.overflowed else diff_trees(template, root)
        except TreeTooLarge:
            log.overflowed = True
        if log.overflowed:
            # Nothing to show the monitor, and nothing earned: scoring refuses it too.
            changes, ended_by = [], "sandbox_too_large"
            tests = TestOutcome() if evaluate else None
        else:
            tests = evaluate(root) if evaluate else None
    final = {(c.path, c.after) for c in changes}
    versions = [v for v in log.versions if (v.path, v.after) not in final]
    return EpisodeResult(turns, commands, changes, versions, ended_by, tool_calls, invalid, tests)


def _arguments(raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return {"raw": raw}
    return parsed if isinstance(parsed, dict) else {"raw": raw}
