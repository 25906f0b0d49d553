"""A sandboxed run's memory, processes and disk, bounded as a whole.

rlimits bound each process: 64 processes of 2 GiB each are still 128 GiB, and a tree
written one 16 MiB file at a time has no bound at all. So every run is also bounded as a
whole, in one of two ways:

* a cgroup v2 of its own, where the machine delegates one to the worker
  (``CSTACK_SANDBOX_CGROUP``: a cgroup directory the worker may write, with the memory and
  pids controllers enabled for its children, as systemd's ``Delegate=yes`` or a
  container's own cgroup namespace gives): ``memory.max`` (the run's memory plus its
  tmpfs, which the kernel charges to it), ``memory.swap.max`` 0 and ``pids.max``, enforced
  by the kernel, the moment a limit is reached;
* otherwise by watching: every 100 ms the harness sums the resident memory of the
  sandbox's processes and counts them, every 500 ms it sums the tree's disk usage, and it
  kills the sandbox once a total is over its bound. A run can overshoot by what it
  allocates in 100 ms (each process is still held to its rlimit).

In both, the tree (``/repo``, on the host's disk) is watched for its size. Which one
applies is said once per worker process (``describe``) and named in the run's result
when a bound ends it (``Completed.exceeded``).
"""

from __future__ import annotations

import logging
import os
import resource
import secrets
import stat
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

POLL_S = 0.1
TREE_POLL_S = 0.5
_PAGE = resource.getpagesize()
_CGROUP_ENV = "CSTACK_SANDBOX_CGROUP"


@dataclass(frozen=True)
class Totals:
    """The bounds on one run as a whole."""

    memory_bytes: int
    processes: int
    tree_bytes: int
    #: Memory the run's tmpfs mounts (/tmp, /dev/shm) may hold, which a cgroup charges.
    tmpfs_bytes: int = 0


def delegated_cgroup() -> tuple[Path | None, str]:
    """The delegated cgroup v2 to put runs in, or None and why there is none."""
    from training.settings import TrainingSettings

    parent = TrainingSettings().sandbox_cgroup
    if parent is None:
        return None, f"{_CGROUP_ENV} is unset"
    named = str(parent)
    try:
        controllers = (parent / "cgroup.subtree_control").read_text().split()
    except OSError as err:
        return None, f"{_CGROUP_ENV}={named} is not a cgroup v2 directory ({err.strerror})"
    missing = {"memory", "pids"} - set(controllers)
    if missing:
        return None, f"{named} does not enable {', '.join(sorted(missing))} for its children"
    if not os.access(parent, os.W_OK):
        return None, f"{named} is not writable by this worker"
    return parent, ""


@cache
def describe() -> str:
    """One line saying how runs are bounded here (logged once per process)."""
    parent, why = delegated_cgroup()
    if parent is not None:
        line = f"sandbox: each run in a cgroup v2 of its own under {parent}"
        logger.info(line)
    else:
        line = (
            f"sandbox: no delegated cgroup v2 ({why}): each run's memory, processes and "
            f"disk are bounded by watching them every {POLL_S * 1000:.0f} ms"
        )
        logger.warning(line)
    return line


class RunCgroup:
    """A cgroup v2 for one run, under the delegated parent; removed by ``close``."""

    def __init__(self, parent: Path, totals: Totals) -> None:
        self.path = parent / f"cstack-run-{secrets.token_hex(6)}"
        self.path.mkdir()
        (self.path / "memory.max").write_text(str(totals.memory_bytes + totals.tmpfs_bytes))
        (self.path / "memory.swap.max").write_text("0")
        (self.path / "pids.max").write_text(str(totals.processes))

    def enter(self) -> None:
        """Move the calling process in (run in the child, before it starts bwrap)."""
        (self.path / "cgroup.procs").write_text("0")

    def exceeded(self) -> str:
        try:
            events = dict(
                line.split() for line in (self.path / "memory.events").read_text().splitlines()
            )
        except (OSError, ValueError):
            return ""
        return (
            "memory: the run's cgroup killed it at its limit"
            if int(events.get("oom_kill", 0))
            else ""
        )

    def close(self) -> None:
        for _ in range(50):  # the kernel frees an emptied cgroup shortly after its last exit
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.02)
        logger.warning("sandbox: cgroup %s not removed", self.path)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found += [int(child) for child in handle.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _tree_of(pid: int) -> list[int]:
    seen, stack = [], [pid]
    while stack:
        current = stack.pop()
        seen.append(current)
        stack += _children(current)
    return seen


def _resident(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def disk_usage(root: Path, cap: int) -> int:
    """Bytes the tree's files take on disk (blocks, so sparse files count what they hold),
    summed until past ``cap``; links and special files are not followed."""
    total, stack = 0, [str(root)]
    while stack and total <= cap:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
    return total


class RunWatch:
    """Polled by the harness while a run goes; names the first total found over its bound."""

    def __init__(self, totals: Totals, tree: Path, cgroup: RunCgroup | None) -> None:
        self.totals = totals
        self.tree = tree
        self.cgroup = cgroup
        self.init_pid: int | None = None
        self._next = self._next_tree = 0.0

    def __call__(self) -> str:
        now = time.monotonic()
        if now < self._next:
            return ""
        self._next = now + POLL_S
        if self.cgroup is not None:
            exceeded = self.cgroup.exceeded()
            if exceeded:
                return exceeded
        elif self.init_pid is not None:
            pids = _tree_of(self.init_pid)
            # bwrap's init and the launcher are not the command's processes.
            if len(pids) > self.totals.processes + 2:
                return f"processes: {len(pids)} over the run's {self.totals.processes}"
            memory = sum(_resident(pid) for pid in pids)
            if memory > self.totals.memory_bytes:
                return (
                    f"memory: {memory / 2**20:.0f} MiB in {len(pids)} processes over the "
                    f"run's {self.totals.memory_bytes / 2**20:.0f} MiB"
                )
        if now >= self._next_tree:
            self._next_tree = now + TREE_POLL_S
            used = disk_usage(self.tree, self.totals.tree_bytes)
            if used > self.totals.tree_bytes:
                return f"disk: the tree holds over {self.totals.tree_bytes / 2**20:.0f} MiB"
        return ""
