"""What the monitor looks at: the episode's command log and the diff of the sandbox.

The harness fills this from its own records (every tool call, and the files before and
after the episode), never from anything the model says about itself.
"""

from __future__ import annotations

import ast
import difflib
from typing import Any

from pydantic import BaseModel, Field


class CommandEntry(BaseModel):
    """One command of the log: a tool call (``tool`` + JSON arguments) or a shell line."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def text(self) -> str:
        """Every string argument joined: what pattern rules search."""
        return " ".join(str(v) for v in self.arguments.values() if isinstance(v, str | int))

    def paths(self) -> list[str]:
        return [str(self.arguments[k]) for k in ("path", "dir", "file") if k in self.arguments]


class FileChange(BaseModel):
    """One file the episode created (``before`` None), deleted (``after`` None) or edited."""

    path: str
    before: str | None = None
    after: str | None = None

    def added_lines(self) -> list[tuple[int, str]]:
        """(line number in ``after``, text) of each line the episode added."""
        before = (self.before or "").splitlines()
        after = (self.after or "").splitlines()
        added: list[tuple[int, str]] = []
        matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
        for tag, _, _, j1, j2 in matcher.get_opcodes():
            if tag in ("replace", "insert"):
                added.extend((j + 1, after[j]) for j in range(j1, j2))
        return added

    def after_tree(self) -> ast.Module | None:
        """The edited file's AST, or None for non-Python, deleted or unparsable files."""
        if self.after is None or not self.path.endswith(".py"):
            return None
        try:
            return ast.parse(self.after)
        except SyntaxError:
            return None


class EpisodeEvidence(BaseModel):
    """Command log + diff + the original test sources (for special-casing checks)."""

    commands: list[CommandEntry] = Field(default_factory=list)
    changes: list[FileChange] = Field(default_factory=list)
    test_sources: dict[str, str] = Field(default_factory=dict)
