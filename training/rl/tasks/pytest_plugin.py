"""The reporter a scoring run loads first: one record per test phase, sent as it happens.

``training.rl.tasks.suite`` mounts this file into the sandbox as ``cstack_report`` and runs
pytest with ``-p cstack_report``, so it is imported before any conftest or test module,
that is before any code of the episode runs. At import it reads the run's key from a
one-shot pipe and closes it. Each record then goes out at once, tagged with the key, as a
JSON line on a pipe whose read end the harness holds outside the sandbox; nothing is kept
here to be read back at the end, so nothing can be rewritten after the fact. The harness
decides what passed (see ``training.rl.tasks.suite`` for the rules and the threat model).

Record shapes: ``{"test", "when", "outcome", "xfail"}`` per phase of a test,
``{"collect_error"}`` per module that failed to collect, ``{"finish": exitstatus}`` last.

Standalone on purpose (the standard library and pytest only): the sandbox sees this file,
not the project. The fd numbers come from ``CSTACK_REPORT_FD`` and
``CSTACK_REPORT_KEY_FD``, named so in ``training.rl.agent.isolation``; without them (a run
outside the harness) the plugin does nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest


def _open_channel() -> tuple[int, str] | None:
    report_fd, key_fd = os.environ.get("CSTACK_REPORT_FD"), os.environ.get("CSTACK_REPORT_KEY_FD")
    if not report_fd or not key_fd:
        return None
    chunks = []
    while chunk := os.read(int(key_fd), 4096):
        chunks.append(chunk)
    os.close(int(key_fd))
    return int(report_fd), b"".join(chunks).decode()


_CHANNEL = _open_channel()


def _send(record: dict[str, Any]) -> None:
    if _CHANNEL is None:
        return
    fd, key = _CHANNEL
    line = memoryview((json.dumps({"key": key, **record}) + "\n").encode())
    while line:
        line = line[os.write(fd, line) :]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _send({
        "test": report.nodeid, "when": report.when, "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"),
    })  # fmt: skip


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _send({"collect_error": report.nodeid})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _send({"finish": int(exitstatus)})
