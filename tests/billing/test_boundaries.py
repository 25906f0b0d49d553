"""Billing's package boundaries, read from the source (``ast``), function-local imports
included: Redis plumbing knows nothing of money, and the gateway (like deploy and
training) reaches billing through ``billing.contract`` only."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MONEY = ("billing.prices", "billing.ledger", "billing.stripe", "billing.meter")
#: What a package outside billing may import of it: the contract, the settings its CLI
#: reads, and billing's own commands, which `cstack` mounts.
OUTSIDE_MAY_IMPORT = {"billing.contract", "billing.settings", "billing.cli"}


def imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "billing":
                yield from (f"billing.{alias.name}" for alias in node.names)
            else:
                yield node.module


def test_redis_plumbing_imports_no_money() -> None:
    for path in sorted((ROOT / "billing" / "redis").rglob("*.py")):
        money = [name for name in imports(path) if name.startswith(MONEY)]
        assert not money, f"{path.relative_to(ROOT)} imports {money}"


@pytest.mark.parametrize("package", ["gateway", "deploy", "training", "serving"])
def test_the_rest_of_the_project_uses_billing_through_its_contract(package: str) -> None:
    for path in sorted((ROOT / package).rglob("*.py")):
        names = [name for name in imports(path) if name == "billing" or name.startswith("billing.")]
        wrong = [name for name in names if name not in OUTSIDE_MAY_IMPORT]
        assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"
