"""The five tools an episode can call, executed against its sandbox with hard limits.

The file tools run in the harness and resolve every path inside the sandbox (no ``..``,
no absolute paths, no symlinks out). ``run_tests`` runs the model's code, so it runs
pytest through ``training.rl.agent.isolation``: the sandbox tree and nothing else of the
host, no network, no credentials, limits on CPU, memory, processes, file size and wall
time, and no process left behind. Outputs are truncated to a fixed size so one call
cannot flood the context.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.rl.agent.isolation import RunLimits, run_isolated
from training.rl.agent.pytest_run import pytest_run
from training.rl.agent.trees import read_regular

TOOL_NAMES = ("list_dir", "read_file", "write_file", "run_tests", "finish")

TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Replace a file's contents.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite (optionally some test ids).",
        "parameters": {"type": "object", "properties": {
            "tests": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {
        "name": "finish", "description": "End the episode: the work is done.",
        "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits: the tools' own, and those ``run_tests`` runs pytest under."""

    test_timeout_s: float = 60.0
    max_output_chars: int = 4000
    max_processes: int = 64
    max_memory_bytes: int = 2 * 1024**3
    max_file_bytes: int = 16 * 1024**2
    max_tmp_bytes: int = 256 * 1024**2

    def run_limits(self) -> RunLimits:
        return RunLimits(
            wall_time_s=self.test_timeout_s,
            cpu_time_s=math.ceil(self.test_timeout_s),
            max_processes=self.max_processes,
            max_memory_bytes=self.max_memory_bytes,
            max_file_bytes=self.max_file_bytes,
            max_tmp_bytes=self.max_tmp_bytes,
            # Bytes, so at least the characters a reply keeps (UTF-8 is at most 4 a char).
            max_output_bytes=4 * self.max_output_chars,
        )


@dataclass(frozen=True)
class ToolOutcome:
    content: str
    ok: bool
    finished: bool = False


class ToolBox:
    """Executes tool calls against one sandbox directory."""

    def __init__(
        self,
        root: Path,
        limits: SandboxLimits,
        python_paths: Sequence[str] = (".",),
        dependencies: Sequence[str] = (),
    ) -> None:
        self.root = Path(root).resolve()
        self.limits = limits
        self.python_paths = list(python_paths)
        #: Distributions the task's code and tests import (``TaskSpec.dependencies``).
        self.dependencies = list(dependencies)

    def _truncate(self, text: str) -> str:
        cap = self.limits.max_output_chars
        if len(text) <= cap:
            return text
        return text[:cap] + f"\n[... truncated {len(text) - cap} characters]"

    def _resolve(self, relative: object) -> Path:
        if not isinstance(relative, str) or not relative:
            raise ValueError("path must be a non-empty string")
        if Path(relative).is_absolute():
            raise ValueError(f"path {relative!r} must be relative to the repository")
        target = (self.root / relative).resolve()
        if target != self.root and self.root not in target.parents:
            raise ValueError(f"path {relative!r} leaves the repository")
        return target

    def call(self, name: str, raw_arguments: str) -> ToolOutcome:
        """Run one call. Unknown tools and bad arguments are answered, never raised."""
        if name not in TOOL_NAMES:
            return ToolOutcome(
                f"Tool not found: {name!r}. Available tools: {', '.join(TOOL_NAMES)}.", ok=False
            )
        try:
            arguments = json.loads(raw_arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            return getattr(self, f"_{name}")(arguments)
        except (ValueError, TypeError) as err:
            return ToolOutcome(f"Invalid arguments for {name}: {err}", ok=False)
        except OSError as err:
            return ToolOutcome(f"Error: {err.strerror or err}", ok=False)

    def _list_dir(self, arguments: dict[str, Any]) -> ToolOutcome:
        target = self._resolve(arguments.get("path", "."))
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
        return ToolOutcome(self._truncate("\n".join(entries)), ok=True)

    def _read_file(self, arguments: dict[str, Any]) -> ToolOutcome:
        target = self._resolve(arguments.get("path"))
        data = read_regular(target, self.limits.max_file_bytes)
        if data is None:  # a FIFO would block the harness forever; a device, flood it
            raise ValueError(f"{arguments['path']!r} is not a regular file")
        return ToolOutcome(self._truncate(data.decode(errors="replace")), ok=True)

    def _write_file(self, arguments: dict[str, Any]) -> ToolOutcome:
        target = self._resolve(arguments.get("path"))
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ValueError("content must be a string")
        if len(content.encode()) > self.limits.max_file_bytes:
            raise ValueError(f"content is over {self.limits.max_file_bytes} bytes")
        target.parent.mkdir(parents=True, exist_ok=True)
        # Non-blocking and no links: an existing FIFO fails (ENXIO) instead of hanging.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{arguments['path']!r} is not a regular file")
            handle.truncate()
            handle.write(content)
        return ToolOutcome(f"wrote {len(content)} characters to {arguments['path']}", ok=True)

    def _finish(self, arguments: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome("episode finished", ok=True, finished=True)

    def _run_tests(self, arguments: dict[str, Any]) -> ToolOutcome:
        tests = arguments.get("tests") or []
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ValueError("tests must be a list of test ids")
        run = pytest_run(["-q", "-p", "no:cacheprovider", *tests], self.python_paths,
                         self.dependencies)  # fmt: skip
        done = run_isolated(
            run.argv, self.root, self.limits.run_limits(), run.env, mounts=run.mounts,
            runtime=run.runtime,
        )  # fmt: skip
        text = done.output.decode(errors="replace")
        if done.timed_out:
            text += f"\n[killed after {self.limits.test_timeout_s:g}s]"
        return ToolOutcome(self._truncate(text), ok=done.returncode == 0 and not done.timed_out)
