"""`make install`'s pip, with a line per phase instead of minutes of silence.

``python -m deploy.pip_progress ARGS...`` runs ``python -m pip install ARGS...`` and shows
where it is: resolving (packages collected so far), downloading, installing (the longest
phase: unpacking about 4 GB and compiling it to bytecode), each with the seconds it took.
On a terminal the current phase is one line, redrawn every second; piped, it prints a
line per phase change and, while a phase goes on, a line every HEARTBEAT_S seconds.
pip's own warnings and errors pass through, and its full output goes to a log file named
at the start.

The venv holds nothing but pip when this runs: only the standard library here.
"""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

#: pip's phases in the order they come, each with the line that begins it. pip collects
#: (finds, downloads) one package after another, so collecting covers both.
_PHASES = (
    ("collecting", re.compile(r"^(Collecting|Processing|Obtaining|Requirement already sat)")),
    ("building composer-stack", re.compile(r"^Building ")),
    ("installing", re.compile(r"^Installing collected packages: ")),
)
_COLLECTED = _PHASES[0][1]
_DOWNLOAD = re.compile(r"^\s*Downloading \S+ \((\d+(?:\.\d+)?) (kB|MB|GB)\)")
_MB = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}
#: What a reader needs to see as pip said it: its warnings, and everything from an error on.
_WARNING = re.compile(r"^WARNING")
_ERROR = re.compile(r"^(ERROR|error)")
#: Piped, the longest a phase goes without a line (installing alone takes minutes).
HEARTBEAT_S = 20.0


class _Display:
    """The phase and its seconds: one redrawn line on a terminal, else a line per phase."""

    def __init__(self, live: bool, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.live = live
        self.heartbeat_s = heartbeat_s
        self.started = time.monotonic()
        self.printed_at = self.started
        self.phase = "starting pip"
        self.phase_index = -1
        self.phase_started = self.started
        self.detail = ""
        self.times: list[tuple[str, float]] = []

    def enter(self, phase: str, index: int) -> None:
        if phase == self.phase:
            return
        now = time.monotonic()
        self.times.append((self.phase, now - self.phase_started))
        self.phase, self.phase_index, self.phase_started = phase, index, now
        self.detail = ""
        if not self.live:
            print(f"install: {phase} (at {now - self.started:.0f} s)", flush=True)
            self.printed_at = now

    def say(self, line: str) -> None:
        self._clear()
        print(line, flush=True)
        self.printed_at = time.monotonic()
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        if not self.live and now - self.printed_at >= self.heartbeat_s:
            print(f"install: still {self.phase}{self.detail} (at {now - self.started:.0f} s)")
            sys.stdout.flush()
            self.printed_at = now
        if self.live:
            text = f"install: {self.phase}{self.detail} · {time.monotonic() - self.started:.0f} s"
            width = shutil.get_terminal_size().columns - 1
            sys.stdout.write("\r\033[K" + text[:width])
            sys.stdout.flush()

    def finish(self, summary: str) -> None:
        self.times.append((self.phase, time.monotonic() - self.phase_started))
        self._clear()
        phases = ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in self.times)
        print(f"install: {summary} in {time.monotonic() - self.started:.0f} s ({phases})")

    def _clear(self) -> None:
        if self.live:
            sys.stdout.write("\r\033[K")


def _packages(count: int) -> str:
    return f"{count} package" if count == 1 else f"{count} packages"


def _read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def main(args: list[str]) -> int:
    log_path = Path(sys.prefix) / "pip-install.log"
    display = _Display(live=sys.stdout.isatty())
    print(f"install: pip install {' '.join(args)} (full output: {log_path})", flush=True)
    pip = subprocess.Popen(
        [sys.executable, "-m", "pip", "install", "--progress-bar", "off", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert pip.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(pip.stdout, lines), daemon=True).start()
    collected, downloaded_mb, installed, failing = 0, 0.0, "", False
    with log_path.open("w") as log:
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                display.tick()
                continue
            if line is None:
                break
            log.write(line + "\n")
            # Forward only: pip prepares the project's own metadata while collecting.
            for index, (phase, pattern) in enumerate(_PHASES):
                if index >= display.phase_index and pattern.search(line):
                    display.enter(phase, index)
                    if phase == "installing":  # the line lists them all
                        display.detail = f" {_packages(line.count(',') + 1)}"
            if _COLLECTED.search(line):
                collected += 1
            download = _DOWNLOAD.search(line)
            if download:
                downloaded_mb += float(download.group(1)) * _MB[download.group(2)]
            if display.phase == "collecting":
                display.detail = f": {_packages(collected)}, {downloaded_mb:.0f} MB downloaded"
            if line.startswith("Successfully installed "):
                installed = f"{_packages(len(line.split()) - 2)} installed or upgraded"
            failing = failing or bool(_ERROR.search(line))
            if failing or _WARNING.search(line):
                display.say(line)
            display.tick()
    code = pip.wait()
    if code == 0:
        display.finish(installed or "nothing to install")
    else:
        display.say(f"install: pip failed (exit status {code}); its full output: {log_path}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
