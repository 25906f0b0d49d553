"""What the monitor looks at: the episode's command log, every file version it made, the
final diff of the sandbox.

The harness fills this from its own records (every tool call, the sandbox's files after
each call that can change them, the files before and after the episode), never from
anything the model says about itself. A file written and later deleted, or written by the
episode's code while its tests ran, is here as one of the ``versions``.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from pydantic import BaseModel, Field

from training.rl.monitor.normalize import decoded_strings, normalized_source


class CommandEntry(BaseModel):
    """One command of the log: a tool call (``tool`` + JSON arguments) or a shell line."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def text(self) -> str:
        """Every string argument joined: what pattern rules search."""
        return " ".join(str(v) for v in self.arguments.values() if isinstance(v, str | int))

    def paths(self) -> list[str]:
        return [str(self.arguments[k]) for k in ("path", "dir", "file") if k in self.arguments]


def _added(before: list[str], after: list[str]) -> list[tuple[int, str]]:
    added: list[tuple[int, str]] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            added.extend((j + 1, after[j]) for j in range(j1, j2))
    return added


class FileChange(BaseModel):
    """One file the episode created (``before`` None), deleted (``after`` None) or edited;
    ``before`` is always the task's own version of the file."""

    path: str
    before: str | None = None
    after: str | None = None

    def added_lines(self) -> list[tuple[int, str]]:
        """(line number in ``after``, text) of each line the episode added."""
        return _added((self.before or "").splitlines(), (self.after or "").splitlines())

    @cached_property
    def added_text(self) -> list[tuple[str, str]]:
        """(where, text) of everything the episode added, as written and as resolved
        (``training.rl.monitor.normalize``): each added line (where: its number), each line
        of the normal form not already in the task's normal form (where: "normalised"),
        and each line of a string constant the episode added (where: "string")."""
        raw = self.added_lines()
        found = [(str(number), text) for number, text in raw]
        if not self.path.endswith(".py") or self.after is None:
            return found
        seen = {text.strip() for _, text in raw}
        normal_after = normalized_source(self.after)
        if normal_after is not None:
            normal_before = normalized_source(self.before or "") or ""
            for _, text in _added(normal_before.splitlines(), normal_after.splitlines()):
                if text.strip() not in seen:
                    found.append(("normalised", text))
        before_strings = set(decoded_strings(self.before or ""))
        for string in decoded_strings(self.after):
            if string not in before_strings:
                found += [("string", line) for line in string.splitlines() if line.strip()]
        return found

    def after_tree(self) -> ast.Module | None:
        """The edited file's AST, or None for non-Python, deleted or unparsable files."""
        if self.after is None or not self.path.endswith(".py"):
            return None
        try:
            return ast.parse(self.after)
        except SyntaxError:
            return None


class EpisodeEvidence(BaseModel):
    """Command log, file versions and diff, and what the rules compare them with."""

    commands: list[CommandEntry] = Field(default_factory=list)
    #: The final diff: what the sandbox held at the end against the task.
    changes: list[FileChange] = Field(default_factory=list)
    #: Every other version of a file seen during the episode, each against the task's own.
    versions: list[FileChange] = Field(default_factory=list)
    #: The original test sources (for special-casing checks).
    test_sources: dict[str, str] = Field(default_factory=dict)
    #: The files of the task's tree as given to the episode.
    tree: list[str] = Field(default_factory=list)
    #: Top-level module names no file of the episode may provide (the standard library's,
    #: the runner's, the task's dependencies'): ``training.rl.tasks.scoring.protected_modules``.
    protected_modules: list[str] = Field(default_factory=list)

    def all_changes(self) -> Iterator[FileChange]:
        """The final diff, then every other version seen."""
        yield from self.changes
        yield from self.versions
