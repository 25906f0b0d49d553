"""No import cycles between the project's modules, function-local imports included.

The graph is read from the source (``ast``), not from ``sys.modules``, so an import hidden
inside a function or under ``TYPE_CHECKING`` counts the same as one at the top of a file.
Importing ``a.b.c`` also runs the packages ``a`` and ``a.b``, so it adds edges to them.
Run this file directly (``python tests/test_import_cycles.py``) to print every cycle.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("serving", "gateway", "billing", "training", "deploy")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name ``module`` imports (``from a import b`` yields ``a`` and ``a.b``)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for name in _imported_names(module, path):
            target = owner(name)
            # A module's own packages are already running when it runs.
            if target is None or target == module or module.startswith(target + "."):
                continue
            graph[module].add(target)
            # The packages above the target run first; the importer's own are already running.
            parts = target.split(".")
            for depth in range(1, len(parts)):
                parent = ".".join(parts[:depth])
                if parent in modules and not (module + ".").startswith(parent + "."):
                    graph[module].add(parent)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "cycle: " + "; ".join(edges)


def test_no_import_cycles() -> None:
    graph = import_graph(project_modules())
    assert not cycles(graph), "\n".join(describe(c, graph) for c in cycles(graph))


def test_no_imports_the_check_cannot_see() -> None:
    """``importlib.import_module`` and a module ``__getattr__`` (PEP 562 lazy exports) hide
    edges from the graph above; import the defining module instead."""
    hidden = []
    for module, path in project_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute | ast.Name) and "import_module" in (
                getattr(node, "attr", None),
                getattr(node, "id", None),
            ):
                hidden.append(f"{module}:{node.lineno} import_module")
        hidden += [
            f"{module}:{node.lineno} module __getattr__"
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        ]
    assert not hidden, hidden


def test_the_check_sees_function_local_imports(tmp_path: Path) -> None:
    package = tmp_path / "billing"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from billing.b import f\n")
    (package / "b.py").write_text("def f():\n    from billing import a\n    return a\n")
    graph = import_graph(project_modules(tmp_path))
    assert cycles(graph) == [["billing.a", "billing.b"]]


if __name__ == "__main__":
    graph = import_graph(project_modules())
    for component in cycles(graph):
        print(describe(component, graph))
    sys.exit(1 if cycles(graph) else 0)
