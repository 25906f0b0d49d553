"""What `cstack up` shows while it starts: each step with its phase and the seconds it takes.

On a terminal the steps are live rows (rich): a spinner, the phase, the seconds ticking and
the log to look at; when they are done the rows stay as a summary with each step's time.
Piped (CI, a log file, the tests) they become plain lines, one per phase change, each with
the seconds since its step began, so a slow step shows in a log as well as on a screen.

Steps may overlap (vLLM compiles while the gateway starts). A step's phase can come from a
``watch`` callable, polled on a thread of this module's own, so vLLM's phases, read from
its log, keep showing while the main thread is busy with another step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from rich.console import Console, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from serving.process import StopRequested

#: How often watched phases are read and the live rows redrawn.
POLL_S = 0.25


class Step:
    """A step under way, until ``done()``, ``fail()`` or the end of its ``Progress``."""

    def __init__(
        self,
        progress: Progress,
        name: str,
        phase: str,
        log: Path | None,
        watch: Callable[[], str | None] | None,
    ) -> None:
        self.progress = progress
        self.name = name
        self.phase = phase
        self.log = log
        self.watch = watch
        self.started = time.monotonic()
        self.ended: float | None = None
        #: How it ended: done, failed, or stopped (unfinished when the whole start ended).
        self.outcome: str | None = None
        self.spinner = Spinner("dots", style="cyan")

    @property
    def elapsed_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def update(self, phase: str) -> None:
        if phase != self.phase and self.ended is None:
            self.phase = phase
            self.progress.plain(f"{self.name}: {phase} ({self.elapsed_s:.0f} s)")

    def done(self) -> None:
        self._end("done")
        self.progress.plain(f"{self.name}: done in {self.elapsed_s:.1f} s")

    def fail(self) -> None:
        self._end("failed")
        self.progress.plain(f"{self.name}: failed after {self.elapsed_s:.0f} s ({self.phase})")

    def stop(self) -> None:
        self._end("stopped")
        self.progress.plain(f"{self.name}: stopped after {self.elapsed_s:.0f} s ({self.phase})")

    def _end(self, outcome: str) -> None:
        self.ended = time.monotonic()
        self.outcome = outcome
        self.progress.redraw()


class Progress:
    """Use as a context manager; ``say`` prints a line that stays, ``begin`` or ``step``
    starts a step. ``live``: rows redrawn in place (default: when stdout is a terminal)."""

    def __init__(self, console: Console | None = None, live: bool | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.live = self.console.is_terminal if live is None else live
        self.steps: list[Step] = []
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="progress", daemon=True)
        self._display: Live | None = None

    def __enter__(self) -> Progress:
        if self.live:
            self._display = Live(self._rows(), console=self.console, auto_refresh=False)
            self._display.start()
        self._poller.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stopped.set()
        try:
            self._poller.join()
        finally:  # even if a stop signal lands here: the terminal gets its cursor back
            with self._lock:
                for step in self.steps:
                    if step.ended is None:  # another step failed, or a stop was asked for
                        step.stop()
                if self._display is not None:
                    self._display.update(self._rows(), refresh=True)
                    self._display.stop()
                    self._display = None

    def say(self, line: str) -> None:
        """A line that stays: printed above the live rows, or as is when piped."""
        with self._lock:
            if self._display is not None:
                self.console.print(Text(line))
            else:
                print(line, flush=True)

    def plain(self, line: str) -> None:
        """A line for piped output only: on a terminal the live rows already show it."""
        if not self.live:
            self.say(line)

    def begin(
        self,
        name: str,
        phase: str = "starting",
        log: Path | None = None,
        watch: Callable[[], str | None] | None = None,
    ) -> Step:
        """Start a step; ``watch`` returns its current phase (None: no news)."""
        step = Step(self, name, phase, log, watch)
        with self._lock:
            self.steps.append(step)
        self.plain(f"{name}: {phase}" + (f" (log: {log})" if log else ""))
        self.redraw()
        return step

    @contextmanager
    def step(self, name: str, phase: str = "starting", log: Path | None = None) -> Iterator[Step]:
        """A step that ends with the block: done, or failed if the block raises."""
        step = self.begin(name, phase, log)
        try:
            yield step
        except StopRequested:
            raise  # not this step's failure: the end of the Progress marks it stopped
        except BaseException:
            step.fail()
            raise
        step.done()

    def redraw(self) -> None:
        with self._lock:
            if self._display is not None:
                self._display.update(self._rows(), refresh=True)

    def _poll(self) -> None:
        while not self._stopped.wait(POLL_S):
            with self._lock:
                watched = [s for s in self.steps if s.watch is not None and s.ended is None]
            for step in watched:
                assert step.watch is not None
                phase = step.watch()
                if phase is not None:
                    step.update(phase)
            self.redraw()

    def _rows(self) -> RenderableType:
        rows = Table.grid(padding=(0, 1))
        for step in self.steps:
            if step.outcome is None:
                mark: RenderableType = step.spinner
                phase = step.phase
            elif step.outcome == "done":
                mark, phase = Text("✓", style="green"), "done"
            else:
                mark, phase = Text("✗", style="bold red"), f"{step.outcome}: {step.phase}"
            log = Text(f"log: {step.log}", style="dim") if step.log else Text("")
            rows.add_row(
                mark, Text(step.name, style="bold"), Text(phase), f"{step.elapsed_s:5.1f} s", log
            )
        return rows
