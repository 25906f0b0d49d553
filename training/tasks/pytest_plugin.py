"""A pytest plugin loaded into task test runs (``-p``) to record one outcome per test id.

JUnit XML loses pytest node ids; this keeps them exactly. A test passes only if its
setup, call and teardown all pass; skipped, xfailed and errored tests do not pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

_outcomes: dict[str, bool] = {}
_collect_errors: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cstack-results", default=None, help="write test outcomes to this JSON")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    passed = report.passed and not hasattr(report, "wasxfail")
    if report.when == "call" or not passed:
        _outcomes[report.nodeid] = _outcomes.get(report.nodeid, True) and passed
    else:
        _outcomes.setdefault(report.nodeid, True)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _collect_errors.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = session.config.getoption("--cstack-results")
    if target:
        payload = {"outcomes": _outcomes, "collect_errors": _collect_errors}
        Path(target).write_text(json.dumps(payload, sort_keys=True))
