"""`cstack rl`'s display through a pipe (as in CI or a log file): a line per phase and per
step, and a heartbeat line while a step runs longer than the heartbeat interval."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A run in miniature: a phase, a slow step (rollouts arriving), a fast one.
RUN = textwrap.dedent("""
    import time
    from contextlib import ExitStack
    from training.rl.learner.display import SessionDisplay
    from training.rl.learner.loop import StepReport

    received = 0
    with ExitStack() as stack:
        display = SessionDisplay("digits", 2, stack, heartbeat_s=0.3)
        display.show("starting rollout workers")
        display.step_started(1, lambda: received)
        for _ in range(8):
            time.sleep(0.1)
            received += 1
        display.step_done(StepReport(
            step=1, policy_version=1, mean_reward=0.25, invalid_tool_rate=0.0, staleness=0.5,
            rollouts_per_s=8.0, tokens_per_s=100.0, loss=0.0123, dropped_stale=0,
            flagged_turns=0, seconds=1.0,
        ))
        display.step_started(2, lambda: received)
        display.step_done(StepReport(
            step=2, policy_version=2, mean_reward=0.75, invalid_tool_rate=0.0, staleness=0.0,
            rollouts_per_s=20.0, tokens_per_s=100.0, loss=0.5, dropped_stale=0,
            flagged_turns=0, seconds=0.1,
        ))
        display.show("done")
""")


def test_piped_output_has_a_line_per_phase_and_step_and_a_heartbeat() -> None:
    # Its stdout a pipe, as in CI.
    done = subprocess.run(
        [sys.executable, "-c", RUN], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "cstack rl: starting rollout workers"
    step1 = lines.index(
        "step 1/2: reward 0.250, staleness 0.50, 8.00 rollouts/s, loss 0.0123, 1.0 s"
    )
    beats = [line for line in lines[1:step1] if "still running" in line]
    assert beats, done.stdout
    assert all(
        line.startswith("cstack rl: training step 1/2: still running after ") for line in beats
    )
    assert beats[-1].endswith("rollouts received")
    # Step 2 took no heartbeat's time: its line follows step 1's directly.
    assert lines[step1 + 1].startswith("step 2/2: reward 0.750, staleness 0.00, 20.00 rollouts/s")
    assert lines[step1 + 2] == "cstack rl: done"
    # Then the final table, as before.
    assert "cstack rl · digits · done" in done.stdout
