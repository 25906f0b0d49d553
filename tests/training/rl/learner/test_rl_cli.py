"""`cstack rl`'s flags land on SessionConfig's fields, and bad ones fail before anything
starts (the session is replaced by a recorder: no Valkey, vLLM or trainer here)."""

from __future__ import annotations

import signal
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from training.rl.feedback import DEFAULT_FEEDBACK_FILE
from training.rl.learner.config import SessionConfig, parse_task_styles
from training.rl.rollouts.request import TaskStyle


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SessionConfig]]:
    started: list[SessionConfig] = []

    class Recorder:
        def __init__(self, config: SessionConfig, stack: object) -> None:
            started.append(config)

        def run(self) -> Iterator[object]:
            return iter(())

    module = types.ModuleType("training.rl.learner.session")
    module.RlSession = Recorder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "training.rl.learner.session", module)
    # `cstack rl` ignores SIGINT and SIGTERM once its run is over (the stop signals of
    # serving.process); pytest gets its own handlers back.
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield started
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def test_flags_fill_the_session_config(sessions: list[SessionConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "rl", "--out", str(tmp_path), "--environment", "toolchoice", "--no-feedback",
        "--task", "tools-1", "--task", "tools-2", "--engine-url", "http://a:1",
        "--engine-url", "http://b:2", "--metrics-port", "9100", "--lr", "0.5",
        "--mtp-loss-weight", "0.1", "--task-style", "tools-1=low,high",
        "--task-style", "tools-2=,low", "--sampling", "uniform", "--no-dynamic-sampling",
        "--max-staleness", "0", "--correction", "clip",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    (config,) = sessions
    assert config.environment == "toolchoice" and config.feedback is False
    assert config.task_ids == ("tools-1", "tools-2")
    assert config.engine_urls == ("http://a:1", "http://b:2")
    assert (config.metrics_port, config.lr, config.steps, config.out) == (9100, 0.5, 20, tmp_path)
    assert config.mtp_loss_weight == 0.1
    assert config.curriculum.sampling == "uniform" and not config.curriculum.dynamic_sampling
    assert (config.max_staleness, config.correction) == (0, "clip")
    assert config.styles == {
        "tools-1": TaskStyle(reasoning_effort="low", verbosity="high"),
        "tools-2": TaskStyle(verbosity="low"),
    }
    assert config.task_dir.is_absolute() and config.feedback_config == DEFAULT_FEEDBACK_FILE
    assert config.heartbeat_s == 30.0
    assert len(config.run_id) == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--environment", "chess"], "--environment must be one of digits, toolchoice, coding"),
        (["--environment", "coding"], "coding needs --task ids"),
        (["--environment", "coding", "--task", "nope"], "no task.json for 'nope'"),
        (["--task-style", "digits-0"], "'digits-0' is not TASK=EFFORT[,VERBOSITY]"),
        (["--task-style", "digits-0=low,high,x"], "is not TASK=EFFORT[,VERBOSITY]"),
        (["--task-style", "=low"], "'=low' is not TASK=EFFORT[,VERBOSITY]"),
        (["--task-style", "digits-0="], "'digits-0=' sets neither an effort nor a verbosity"),
        (["--task-style", "tools-0=low"], "'tools-0' is not a task of this run (digits-0, "),
        (["--task", "digits-1", "--task-style", "digits-0=low"], "not a task of this run"),
        (["--task-style", "digits-0=huge"], "effort 'huge' is not one of none, minimal, low"),
        (["--task-style", "digits-0=low,loud"], "verbosity 'loud' is not one of low, medium"),
        (["--task-style", "digits-0=low", "--task-style", "digits-0=high"], "already has a"),
        (["--max-staleness", "-1"], "Invalid value for --max-staleness: must be at least 0"),
        (["--group-size", "1"], "Invalid value for --group-size: must be at least 2, not 1"),
        (["--steps", "0"], "Invalid value for --steps: must be at least 1, not 0"),
        (["--environment", "toolchoice", "--task", "tools-0@9"], "not 'tools-0@9'"),
        (["--sampling", "greedy"], "--sampling must be one of learnability, uniform"),
        (["--correction", "none"], "--correction must be one of tis, clip"),
        (["--heartbeat-s", "0"], "Invalid value for --heartbeat-s: must be more than 0"),
    ],
)
def test_bad_flags_fail_before_the_session(
    sessions: list[SessionConfig], tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(
        app, ["rl", "--out", str(tmp_path), "--task-dir", str(tmp_path), *args]
    )
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())
    assert sessions == []


def test_state_goes_under_the_state_directory(
    sessions: list[SessionConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out, the run's state is rl/ in CSTACK_STATE_DIR, as `cstack up`'s is
    there; the directory is made before the session starts."""
    monkeypatch.setenv("CSTACK_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["rl", "--heartbeat-s", "1.5"])
    assert result.exit_code == 0, result.output
    (config,) = sessions
    assert config.out == config.out_dir == tmp_path / "state" / "rl"
    assert config.heartbeat_s == 1.5
    assert (tmp_path / "state" / "rl" / "steps.jsonl").is_file()
    assert f"step reports in {tmp_path / 'state' / 'rl' / 'steps.jsonl'}" in result.output
    # The library's defaults follow the same setting.
    from training.rl.learner.loop import LoopConfig

    assert SessionConfig().out_dir == tmp_path / "state" / "rl"
    assert LoopConfig().export_dir == tmp_path / "state" / "rl" / "weights"


def test_task_styles_default_to_none_sent(sessions: list[SessionConfig], tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["rl", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (config,) = sessions
    assert config.task_styles == () and config.styles == {}
    assert config.rollout_task_ids == ("digits-0", "digits-1", "digits-2", "digits-3")


def test_parse_task_styles_takes_every_allowed_value() -> None:
    tasks = ("a", "b")
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh", "max"):
        assert parse_task_styles([f"a={effort}"], tasks) == {
            "a": TaskStyle(reasoning_effort=effort)
        }
    for verbosity in ("low", "medium", "high"):
        assert parse_task_styles([f" b = , {verbosity} "], tasks) == {
            "b": TaskStyle(verbosity=verbosity)
        }
    with pytest.raises(ValueError, match="effort 'LOW'"):
        parse_task_styles(["a=LOW"], tasks)


def test_help_explains_task_style() -> None:
    result = CliRunner().invoke(app, ["rl", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    assert "--task-style" in text and "TASK=EFFORT[,VERBOSITY]" in text
    assert (
        "EFFORT: none, minimal, low, medium, high, xhigh, max; VERBOSITY: low, medium, high" in text
    )


def test_help_says_how_it_stops_where_state_goes_and_what_piped_output_shows() -> None:
    result = CliRunner().invoke(app, ["rl", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    assert "Ctrl-C or SIGTERM stops everything it started (Valkey, vLLM, the rollout workers)" in (
        text
    )
    assert "rl/ in the state directory `cstack up` uses (CSTACK_STATE_DIR, default .cstack)" in (
        text
    )
    assert "piped (CI, a log file), a line per phase and per step, and a heartbeat" in text
    assert "--heartbeat-s" in text
