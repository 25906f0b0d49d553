"""Feature deletion by AST: stub out one function, method or class, or drop one module.

The edit is made on the source text at the AST's line positions, so every other line
(comments, formatting) stays byte-identical. A stubbed function keeps its signature,
decorators and docstring (the task statement) and raises NotImplementedError, so the
package still imports and only the behaviour is gone.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.rl.tasks.spec import Feature

STUB = "raise NotImplementedError"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_COMMON = set(dir(builtins)) | set(keyword.kwlist) | {"self", "cls", "args", "kwargs"}


@dataclass(frozen=True)
class Candidate:
    """A deletable feature and how big it is (bigger bodies make better tasks)."""

    feature: Feature
    body_lines: int


@dataclass(frozen=True)
class Deletion:
    """The result of deleting a feature: new text per file (None removes it)."""

    feature: Feature
    new_sources: dict[str, str | None]
    deleted_code: str


def _body_after_docstring(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = func.body
    first = body[0] if body else None
    is_docstring = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    return body[1:] if is_docstring else body


def _stubbable(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = _body_after_docstring(func)
    if not body or body[0].lineno == func.lineno:
        return False
    if any(
        isinstance(d, ast.Name) and d.id in ("overload", "abstractmethod")
        for d in func.decorator_list
    ):
        return False
    return not (len(body) == 1 and isinstance(body[0], ast.Raise | ast.Pass))


def _span(func: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = _body_after_docstring(func)
    return (func.end_lineno or func.lineno) - body[0].lineno + 1


def candidates(repo: Path, source_files: list[str]) -> Iterator[Candidate]:
    """Functions, methods, classes and leaf modules that could be deleted."""
    imported_text = {path: (repo / path).read_text(errors="replace") for path in source_files}
    for path in source_files:
        try:
            tree = ast.parse(imported_text[path])
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _stubbable(node):
                yield Candidate(Feature(kind="function", path=path, name=node.name), _span(node))
            if isinstance(node, ast.ClassDef):
                methods = [
                    m
                    for m in node.body
                    if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and _stubbable(m)
                ]
                for method in methods:
                    name = f"{node.name}.{method.name}"
                    yield Candidate(Feature(kind="method", path=path, name=name), _span(method))
                if len(methods) >= 2:
                    size = sum(_span(m) for m in methods)
                    yield Candidate(Feature(kind="class", path=path, name=node.name), size)
        module = Path(path).stem
        if module != "__init__" and not any(
            re.search(rf"\b{re.escape(module)}\b", text)
            for other, text in imported_text.items()
            if other != path
        ):
            lines = len(imported_text[path].splitlines())
            yield Candidate(Feature(kind="file", path=path, name=module), lines)


def _find(tree: ast.Module, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions a feature name covers: one function/method, or a class's methods."""
    head, _, tail = name.partition(".")
    for node in tree.body:
        if node_name(node) != head:
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not tail:
            return [node]
        if isinstance(node, ast.ClassDef):
            methods = [
                m
                for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and _stubbable(m)
            ]
            return [m for m in methods if not tail or m.name == tail]
    raise KeyError(f"no feature {name!r}")


def node_name(node: ast.stmt) -> str | None:
    return getattr(node, "name", None)


def delete_feature(repo: Path, feature: Feature) -> Deletion:
    """Apply the deletion in memory; the caller writes ``new_sources`` into a copy."""
    text = (repo / feature.path).read_text()
    if feature.kind == "file":
        return Deletion(feature, {feature.path: None}, text)
    lines = text.splitlines(keepends=True)
    deleted: list[str] = []
    # Bottom-up so earlier line numbers stay valid while editing.
    for func in sorted(_find(ast.parse(text), feature.name), key=lambda f: -f.lineno):
        body = _body_after_docstring(func)
        start, end = body[0].lineno - 1, func.end_lineno or func.lineno
        indent = " " * body[0].col_offset
        deleted.insert(0, "".join(lines[start:end]))
        lines[start:end] = [f"{indent}{STUB}\n"]
    return Deletion(feature, {feature.path: "".join(lines)}, "".join(deleted))


def canaries(deleted_code: str, remaining_text: str) -> list[str]:
    """Distinctive identifiers and literals of the deleted code found nowhere else.

    Anything still present in the remaining sources cannot reveal the deletion, so only
    tokens unique to the deleted code are kept; the leak scan then requires none of them
    to appear anywhere in the sandbox (caches, bytecode, history, packaged copies).
    """
    tokens: set[str] = set()
    try:
        tree = ast.parse(_dedent_block(deleted_code))
    except SyntaxError:
        tokens = set(_IDENTIFIER.findall(deleted_code))
    else:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                tokens.add(node.id)
            elif isinstance(node, ast.Attribute):
                tokens.add(node.attr)
            elif isinstance(node, ast.arg):
                tokens.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                literal = node.value.strip()
                if "\n" not in literal:
                    tokens.add(literal)
    distinctive = {t for t in tokens if len(t) >= 4 and t not in _COMMON}
    return sorted(t for t in distinctive if t not in remaining_text)


def _dedent_block(code: str) -> str:
    """Deleted method bodies are indented; wrap them so they parse."""
    return "if True:\n" + "".join(f"    {line}\n" for line in code.splitlines())
