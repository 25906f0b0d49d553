"""The five tools an episode can call, executed inside its sandbox with hard limits.

Every path is resolved inside the sandbox (no ``..``, no absolute paths, no symlinks
out). ``run_tests`` runs pytest in a child process with limits on wall time, processes,
memory and file size, and kills the child's whole process group on timeout. Outputs are
truncated to a fixed size so one call cannot flood the context.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """Per-call limits; ``max_processes`` needs a non-root user to be enforced by the OS."""

    test_timeout_s: float = 60.0
    max_output_chars: int = 4000
    max_processes: int = 64
    max_memory_bytes: int = 2 * 1024**3
    max_file_bytes: int = 16 * 1024**2


@dataclass(frozen=True)
class ToolOutcome:
    content: str
    ok: bool
    finished: bool = False


class ToolBox:
    """Executes tool calls against one sandbox directory."""

    def __init__(
        self, root: Path, limits: SandboxLimits, python_paths: Sequence[str] = (".",)
    ) -> None:
        self.root = Path(root).resolve()
        self.limits = limits
        self.python_paths = list(python_paths)

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
        return ToolOutcome(self._truncate(target.read_text(errors="replace")), ok=True)

    def _write_file(self, arguments: dict[str, Any]) -> ToolOutcome:
        target = self._resolve(arguments.get("path"))
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ValueError("content must be a string")
        if len(content.encode()) > self.limits.max_file_bytes:
            raise ValueError(f"content is over {self.limits.max_file_bytes} bytes")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return ToolOutcome(f"wrote {len(content)} characters to {arguments['path']}", ok=True)

    def _finish(self, arguments: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome("episode finished", ok=True, finished=True)

    def _limit_child(self) -> None:
        """Runs in the child before exec: own process group, OS resource limits."""
        os.setsid()
        limits = self.limits
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
        resource.setrlimit(resource.RLIMIT_AS, (limits.max_memory_bytes, limits.max_memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))

    def _run_tests(self, arguments: dict[str, Any]) -> ToolOutcome:
        tests = arguments.get("tests") or []
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ValueError("tests must be a list of test ids")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "PYTHONPATH": os.pathsep.join(str(self.root / p) for p in self.python_paths),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        proc = subprocess.Popen(
            command, cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            preexec_fn=self._limit_child,
        )  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=self.limits.test_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            text = output.decode(errors="replace")
            return ToolOutcome(
                self._truncate(f"{text}\n[killed after {self.limits.test_timeout_s}s]"), ok=False
            )
        return ToolOutcome(self._truncate(output.decode(errors="replace")), ok=proc.returncode == 0)
