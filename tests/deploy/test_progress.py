"""What `cstack up` shows while it starts: vLLM's phases read from its log, and the plain
lines a piped run prints (one per phase change, with seconds)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from deploy import pip_progress
from deploy.progress import Progress
from serving.launcher import VllmServer

# Lines as vLLM 0.32's CPU build logs them (shortened), in the order it does.
VLLM_LOG = [
    "(APIServer pid=1) INFO 11-30 22:24:18 [api_utils.py:286] non-default args: {'host': ...}",
    "(EngineCore pid=2) INFO 11-30 22:24:30 [core.py:133] Initializing a V1 LLM engine (v0.32.0)",
    "(Worker pid=3) INFO 11-30 22:24:56 [cpu_model_runner.py:68] Starting to load model tiny...",
    "(Worker pid=3) INFO 11-30 22:24:56 [default_loader.py:501] Loading weights took 0.02 seconds",
    "(Worker pid=3) INFO 11-30 22:24:58 [cpu_model_runner.py:87] Warming up model for the "
    "compilation...",
]


def test_vllm_phases_come_from_this_runs_log_lines(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("INFO:     Application startup complete.\n")  # an earlier run's
    server = VllmServer(tmp_path / "model", port=1, log_path=log)
    emit = "import sys, time\nfor line in sys.argv[1:]:\n    print(line, flush=True)\n"
    server.command = [sys.executable, "-c", emit + "time.sleep(60)", *VLLM_LOG]
    server.start()
    try:
        assert server.phase() in (None, "starting the engine process")
        deadline = time.monotonic() + 30
        while server.phase() != "compiling CPU kernels" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.phase() == "compiling CPU kernels"
    finally:
        server.stop()


def test_piped_progress_prints_a_line_per_phase(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress(live=False) as progress:
        progress.say("embedded valkey: redis://:***@127.0.0.1:1/0")
        vllm = progress.begin("vLLM", "importing vLLM", log=Path("logs/vllm.log"))
        with progress.step("gateway"):
            pass
        vllm.update("loading weights")
        vllm.update("loading weights")  # no news: no line
        vllm.done()
        with pytest.raises(RuntimeError), progress.step("ledger", "migrating"):
            raise RuntimeError("migration failed")
        progress.begin("billing beat")  # still under way when the start ends
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "embedded valkey: redis://:***@127.0.0.1:1/0",
        "vLLM: importing vLLM (log: logs/vllm.log)",
        "gateway: starting",
    ]
    assert lines[3].startswith("gateway: done in ")
    assert lines[4] == "vLLM: loading weights (0 s)"
    assert lines[5].startswith("vLLM: done in ")
    assert lines[6] == "ledger: migrating"
    assert lines[7].startswith("ledger: failed after 0 s (migrating)")
    assert lines[8:] == ["billing beat: starting", "billing beat: stopped after 0 s (starting)"]


def test_piped_pip_install_prints_a_line_while_a_long_phase_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`make install` piped (make up in CI, a log file): pip's installing phase takes
    minutes; a heartbeat line comes at least every heartbeat_s."""
    display = pip_progress._Display(live=False, heartbeat_s=0.05)
    display.enter("installing", 2)
    display.detail = " 206 packages"
    display.tick()  # too soon: nothing
    time.sleep(0.06)
    display.tick()
    display.tick()  # just printed: nothing
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("install: installing (at ")
    assert len(lines) == 2 and lines[1].startswith("install: still installing 206 packages (at ")
    assert pip_progress.HEARTBEAT_S <= 30  # the longest a step may stay silent
