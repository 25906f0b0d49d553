"""The rules that turn a scoring run's record stream into outcomes (training.rl.tasks.suite)."""

from __future__ import annotations

import json
from typing import Any

from training.rl.agent.isolation import Completed
from training.rl.tasks.suite import read_report

KEY = "k3y"
TEST = "tests/test_a.py::test_one"


def _phases(test: str, outcome: str = "passed", **extra: Any) -> list[dict[str, Any]]:
    return [
        {"test": test, "when": when, "outcome": outcome, "xfail": False, **extra}
        for when in ("setup", "call", "teardown")
    ]


def _done(records: list[dict[str, Any]], returncode: int = 0, **kwargs: Any) -> Completed:
    lines = "".join(json.dumps({"key": KEY, **record}) + "\n" for record in records)
    return Completed(returncode, b"", 0, kwargs.pop("timed_out", False), lines.encode())


def test_a_clean_run_passes_its_tests() -> None:
    result = read_report(_done([*_phases(TEST), {"finish": 0}]), KEY)
    assert result.outcomes == {TEST: True} and not result.rejected


def test_a_failed_skipped_or_xfailed_phase_fails_the_test() -> None:
    failed = [*_phases(TEST)[:1], {**_phases(TEST)[1], "outcome": "failed"}, _phases(TEST)[2]]
    skipped = [{**_phases(TEST)[0], "outcome": "skipped"}, _phases(TEST)[2]]
    xfailed = _phases(TEST, xfail=True)
    for records in (failed, skipped, xfailed):
        assert read_report(_done([*records, {"finish": 1}], 1), KEY).outcomes == {TEST: False}


def test_a_forged_pass_next_to_the_real_failure_fails() -> None:
    real = [{**record, "outcome": "failed"} for record in _phases(TEST)]
    result = read_report(_done([*_phases(TEST), *real, {"finish": 1}], 1), KEY)
    assert result.outcomes == {TEST: False}


def test_a_run_that_did_not_end_normally_passes_nothing() -> None:
    unfinished = read_report(_done(_phases(TEST)), KEY)
    assert unfinished.outcomes == {} and "did not end" in unfinished.rejected
    mismatch = read_report(_done([*_phases(TEST), {"finish": 0}], returncode=137), KEY)
    assert mismatch.outcomes == {} and "exit status 137" in mismatch.rejected
    timed_out = read_report(_done([*_phases(TEST), {"finish": 0}], timed_out=True), KEY)
    assert timed_out.outcomes == {} and timed_out.timed_out


def test_records_without_the_key_or_torn_lines_void_the_run() -> None:
    done = _done([*_phases(TEST), {"finish": 0}])
    forged = json.dumps({"test": "x", "when": "call", "outcome": "passed"}).encode()
    for report in (forged + b"\n" + done.report, done.report + b'{"key": "k3y"', b"not json\n"):
        voided = read_report(Completed(0, b"", 0, False, report), KEY)
        assert voided.outcomes == {} and voided.rejected
