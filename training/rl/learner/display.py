"""What `cstack rl` shows while it runs: a live table on a terminal, plain lines when piped.

On a terminal the table holds the last 15 step reports under a title saying what is going
on. Piped (CI, a log file) rich shows only the final table, so every phase and every step
gets a line of its own, and a heartbeat line says what is still running when nothing was
printed for ``heartbeat_s`` (a step waiting minutes for coding rollouts is not a hang).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:  # the loop imports torch; the display is tested without it
    from training.rl.learner.loop import StepReport


class SessionDisplay:
    def __init__(
        self, environment: str, steps: int, stack: ExitStack, heartbeat_s: float = 30.0
    ) -> None:
        self.environment = environment
        self.steps = steps
        self.heartbeat_s = heartbeat_s
        self.history: list[StepReport] = []
        # Piped output (logs, CI) gets a width that fits every column, not rich's 80.
        console = Console() if sys.stdout.isatty() else Console(width=110)
        self.piped = not console.is_terminal
        if self.piped:
            # Piped, rich prints the final table without a newline after it; this callback
            # runs once the Live below has stopped.
            stack.callback(console.line)
        self.live = stack.enter_context(
            Live(self._table("starting"), console=console, refresh_per_second=2)
        )
        self._engine_phase = ""
        # What runs now, since when, and what the heartbeat adds about it (rollouts in).
        self._lock = threading.Lock()
        self._status = "starting"
        self._status_since = self._last_line = time.monotonic()
        self._detail: Callable[[], str] | None = None
        self._stopped = threading.Event()
        if self.piped:
            beats = threading.Thread(target=self._beat, name="cstack-rl-heartbeat", daemon=True)
            beats.start()
            stack.callback(beats.join)
            stack.callback(self._stopped.set)

    def show(self, status: str) -> None:
        """A phase of the run (``starting valkey``): in the title, and piped a line."""
        self._set_status(status)
        self.live.update(self._table(status))
        if self.piped:
            self._line(f"cstack rl: {status}")

    def show_engine_start(self, phase: str, seconds: float, log: Path) -> None:
        """vLLM's start: in the title on a terminal, ticking; piped, a line per phase."""
        status = f"starting vLLM: {phase}"
        if not self.piped:
            self.live.update(self._table(f"{status} · {seconds:.0f} s · log: {log}"))
        elif phase != self._engine_phase:
            self._set_status(status)
            self._line(f"vLLM: {phase} ({seconds:.0f} s, log: {log})")
        self._engine_phase = phase

    def step_started(self, step: int, received: Callable[[], int]) -> None:
        """Step ``step`` runs; ``received()``: rollouts received so far (for the heartbeat).
        No line of its own: its report is the line."""
        status = f"training step {step}/{self.steps}"
        before = received()
        self._set_status(status, lambda: f"{received() - before} rollouts received")
        self.live.update(self._table(status))

    def step_done(self, report: StepReport) -> None:
        self.history.append(report)
        status = f"step {report.step}/{self.steps} done"
        self._set_status(status)
        self.live.update(self._table(status))
        if self.piped:
            self._line(
                f"step {report.step}/{self.steps}: reward {report.mean_reward:.3f}, "
                f"staleness {report.staleness:.2f}, {report.rollouts_per_s:.2f} rollouts/s, "
                f"loss {report.loss:.4f}, {report.seconds:.1f} s"
            )

    def _set_status(self, status: str, detail: Callable[[], str] | None = None) -> None:
        with self._lock:
            self._status, self._detail = status, detail
            self._status_since = time.monotonic()

    def _line(self, text: str) -> None:
        with self._lock:
            self._last_line = time.monotonic()
        self.live.console.print(text, highlight=False, soft_wrap=True)

    def _beat(self) -> None:
        """Piped: a line saying what still runs whenever ``heartbeat_s`` passed without one."""
        while not self._stopped.wait(min(self.heartbeat_s / 4, 1.0)):
            with self._lock:
                now = time.monotonic()
                if now - self._last_line < self.heartbeat_s:
                    continue
                status, since, detail = self._status, self._status_since, self._detail
            extra = f", {detail()}" if detail is not None else ""
            self._line(f"cstack rl: {status}: still running after {now - since:.0f} s{extra}")

    def _table(self, status: str) -> Table:
        table = Table(title=f"cstack rl · {self.environment} · {status}")
        for column in ("step", "version", "reward", "invalid tools", "staleness",
                       "rollouts/s", "tokens/s", "loss", "dropped"):  # fmt: skip
            table.add_column(column, justify="right")
        for r in self.history[-15:]:
            table.add_row(
                str(r.step), str(r.policy_version), f"{r.mean_reward:.3f}",
                f"{r.invalid_tool_rate:.3f}", f"{r.staleness:.2f}", f"{r.rollouts_per_s:.2f}",
                f"{r.tokens_per_s:.1f}", f"{r.loss:.4f}", str(r.dropped_stale),
            )  # fmt: skip
        return table
