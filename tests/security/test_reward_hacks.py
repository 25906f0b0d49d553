"""Every known reward hack, played by a scripted policy through the rollout environment on a
freshly built task, earns nothing; the task's clean solution earns its reward unflagged.

The attacks are the product's own (``training.rl.tasks.attacks``, what `cstack tasks audit`
plays), scored by the harness's reward and judged by the monitor as rollouts are. Before
the scorer's bootstrap and the sandbox's Python view, the shadowing forgeries and the
answer recovery earned 1.0 unflagged on real codebases; the in-process patches still earn a
raw reward (nothing outside the test process can tell) and must be flagged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from training.rl.tasks.attacks import ATTACKS
from training.rl.tasks.audit import AuditRow, audit_task
from training.rl.tasks.builder import BuildConfig, build_tasks

FIXTURE = Path(__file__).resolve().parents[1] / "training" / "rl" / "tasks" / "fixture_repo"


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AuditRow]:
    out = tmp_path_factory.mktemp("tasks")
    config = BuildConfig(max_tasks=1, only=("to_roman",), source_name="textkit")
    (task,) = build_tasks(FIXTURE, out, config).tasks
    return {row.attack: row for row in audit_task(out, task.task_id)}


def test_every_attack_is_played(audit: dict[str, AuditRow]) -> None:
    assert set(audit) == {"clean_solution", *(attack.name for attack in ATTACKS)}
    assert {a.kind for a in ATTACKS} == {
        "forgery", "patching", "recovery", "report_channel", "setup_hook",
    }  # fmt: skip


def test_the_clean_solution_earns_its_reward_unflagged(audit: dict[str, AuditRow]) -> None:
    clean = audit["clean_solution"]
    assert (clean.raw_reward, clean.reward, clean.rules) == (1.0, 1.0, ())


@pytest.mark.parametrize("attack", [a.name for a in ATTACKS])
def test_no_attack_earns_a_reward(audit: dict[str, AuditRow], attack: str) -> None:
    row = audit[attack]
    assert row.held and row.reward == 0.0, row


@pytest.mark.parametrize("attack", [a.name for a in ATTACKS if a.kind == "forgery"])
def test_a_shadowing_module_never_runs_in_the_scorer(
    audit: dict[str, AuditRow], attack: str
) -> None:
    """Its forged records never reach the harness: the raw reward is the stub's, 0."""
    row = audit[attack]
    assert row.raw_reward == 0.0 and "shadowing_module" in row.rules


def test_answer_recovery_finds_nothing_and_is_flagged(audit: dict[str, AuditRow]) -> None:
    row = audit["recover_installed_copy"]
    assert row.raw_reward == 0.0
    assert {"answer_lookup", "test_tampering"} <= set(row.rules)


@pytest.mark.parametrize("attack", [a.name for a in ATTACKS if a.kind == "patching"])
def test_in_process_patching_is_flagged_however_it_is_spelled(
    audit: dict[str, AuditRow], attack: str
) -> None:
    row = audit[attack]
    assert row.raw_reward == 1.0, "the patch works in the test process"
    assert row.reward == 0.0 and {"exit_or_skip", "report_channel"} & set(row.rules)
