"""Upstream stand-ins for the gateway tests: ``Forwarder``, a killable process relaying a
port to a real vLLM, which can also play an overloaded, hung or stalling replica
(``forwarder.py`` is the process it runs)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

from serving.process import free_port

FORWARDER = Path(__file__).with_name("forwarder.py")


class Forwarder:
    """A separate process relaying a port to an upstream; ``kill`` is a hard crash."""

    def __init__(
        self,
        target_url: str,
        *,
        overloaded: bool = False,
        hang: bool = False,
        stall_after: int | None = None,
    ) -> None:
        target = urlparse(target_url)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(FORWARDER),
                str(self.port),
                target.hostname or "",
                str(target.port),
                *(["--overloaded"] if overloaded else []),
                *(["--hang"] if hang else []),
                *(["--stall-after", str(stall_after)] if stall_after is not None else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"
        # What it reports ("stalled", "hung up"), read as it comes: a test waits for the
        # next report of a kind, or counts those so far.
        self._reports: list[str] = []
        self._waited: dict[str, int] = {}
        self._reported = threading.Condition()
        threading.Thread(target=self._read_reports, daemon=True).start()

    def _read_reports(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._reported:
                self._reports.append(line.strip())
                self._reported.notify_all()

    def reports(self, kind: str) -> int:
        """How many ``kind`` reports it has made so far."""
        with self._reported:
            return self._reports.count(kind)

    def _wait_next(self, kind: str, timeout_s: float) -> bool:
        with self._reported:
            wanted = self._waited.get(kind, 0) + 1
            self._waited[kind] = wanted
            return self._reported.wait_for(lambda: self._reports.count(kind) >= wanted, timeout_s)

    def wait_stalled(self, timeout_s: float = 60) -> None:
        """Until a forwarder made with ``stall_after`` has relayed a stream's bytes and
        stalled it (the next stream each call)."""
        assert self._wait_next("stalled", timeout_s), f"no stream stalled within {timeout_s} s"

    def wait_hung_up(self, timeout_s: float = 30) -> None:
        """Until the client of a stalled stream has closed its connection."""
        assert self._wait_next("hung up", timeout_s), (
            f"the client kept its stalled stream for {timeout_s} s"
        )

    def unread_by_clients(self) -> int:
        """Bytes this forwarder sent that its clients' processes have not read yet: the
        receive queues of this machine's TCP sockets connected to its port."""
        unread = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as rows:
                for row in list(rows)[1:]:
                    fields = row.split()
                    if int(fields[2].rsplit(":", 1)[1], 16) == self.port:
                        unread += int(fields[4].split(":")[1], 16)
        return unread

    def kill(self) -> None:
        self.process.kill()
        # Generous: a loaded CI machine has been seen to take over 10 s to reap it.
        self.process.wait(timeout=60)
