"""A sandboxed run bounded as a whole (memory, processes, disk) and its seccomp filter,
against the real sandbox (bwrap) on this machine, which delegates no cgroup v2: the runs
here are bounded by the harness watching them (training.rl.agent.run_bounds)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from training.rl.agent.isolation import RunLimits, run_isolated
from training.rl.agent.run_bounds import RunCgroup, Totals, delegated_cgroup, describe
from training.rl.agent.runtime import python_runtime
from training.rl.agent.seccomp import seccomp_program

MiB = 1024**2


def _run(tree: Path, code: str, limits: RunLimits) -> tuple[str, str]:
    runtime = python_runtime()
    done = run_isolated([runtime.interpreter, "-c", code], tree, limits, {}, runtime=runtime)
    return done.output.decode(errors="replace"), done.exceeded


def test_processes_each_under_their_limit_are_stopped_together(tmp_path: Path) -> None:
    """Six processes of 200 MiB each, every one under its 768 MiB rlimit, 1.2 GiB together:
    the run's 320 MiB total stops them all."""
    code = (
        "import os, time\n"
        "for _ in range(5):\n"
        "    if os.fork() == 0:\n"
        "        break\n"
        "hold = bytearray(200 * 1024 * 1024)\n"
        "print('HOLDING', flush=True)\n"
        "time.sleep(60)\n"
    )
    limits = RunLimits(wall_time_s=60, max_memory_bytes=768 * MiB,
                       max_total_memory_bytes=320 * MiB)  # fmt: skip
    _, exceeded = _run(tmp_path, code, limits)
    assert exceeded.startswith("memory: ") and "over the run's 320 MiB" in exceeded


def test_a_tree_filled_file_by_file_is_stopped(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "for i in range(64):\n"
        "    open(f'part{i}.bin', 'wb').write(b'x' * 1024 * 1024)\n"
        "print('WROTE', flush=True)\n"
        "time.sleep(60)\n"
    )
    limits = RunLimits(wall_time_s=60, max_file_bytes=2 * MiB, max_tree_bytes=16 * MiB)
    output, exceeded = _run(tmp_path, code, limits)
    assert exceeded == "disk: the tree holds over 16 MiB"
    assert len(list(tmp_path.glob("part*.bin"))) < 64 or "WROTE" in output


def test_a_quiet_run_is_not_stopped(tmp_path: Path) -> None:
    output, exceeded = _run(tmp_path, "print('fine')", RunLimits(wall_time_s=30))
    assert output.strip() == "fine" and exceeded == ""


_SECCOMP_PROBE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    result = getattr(libc, name)(*args)
    return 0 if result >= 0 else ctypes.get_errno()
found = {
    "unshare_user": call("unshare", 0x10000000),
    "unshare_mount": call("unshare", 0x00020000),
    "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, None),
    "ptrace": call("ptrace", 0, 0, None, None),
    "clone3": call("syscall", 435, None, 0),
    "bpf": call("syscall", 321, 0, None, 0),
}
pid = os.fork()
if pid == 0:
    os._exit(7)
found["fork"] = os.waitpid(pid, 0)[1] >> 8
print(json.dumps(found))
"""


def test_the_seccomp_filter_refuses_namespaces_mounts_and_tracing(tmp_path: Path) -> None:
    output, _ = _run(tmp_path, _SECCOMP_PROBE, RunLimits(wall_time_s=30))
    found = json.loads(output.strip().splitlines()[-1])
    assert found["unshare_user"] == errno.EPERM and found["unshare_mount"] == errno.EPERM
    assert found["mount"] == errno.EPERM and found["ptrace"] == errno.EPERM
    assert found["bpf"] == errno.EPERM
    assert found["clone3"] == errno.ENOSYS  # so the C library falls back to clone
    assert found["fork"] == 7  # plain processes still start


def test_the_filter_is_built_for_both_architectures_and_none_else() -> None:
    for machine in ("x86_64", "aarch64"):
        program = seccomp_program(machine)
        assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 256
    assert seccomp_program("riscv64") is None


def test_without_a_delegated_cgroup_the_worker_says_how_runs_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CSTACK_SANDBOX_CGROUP", raising=False)
    parent, why = delegated_cgroup()
    assert parent is None and why == "CSTACK_SANDBOX_CGROUP is unset"
    describe.cache_clear()
    assert describe().startswith("sandbox: no delegated cgroup v2 (CSTACK_SANDBOX_CGROUP is unset)")


def test_a_delegated_cgroup_gets_each_run_its_own_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the machine delegates one (here a directory shaped like it: no kernel behind
    it on this machine), a run's cgroup is made under it with the run's totals."""
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    monkeypatch.setenv("CSTACK_SANDBOX_CGROUP", str(tmp_path))
    parent, why = delegated_cgroup()
    assert parent == tmp_path and why == ""
    cgroup = RunCgroup(tmp_path, Totals(300 * MiB, 32, 64 * MiB, tmpfs_bytes=16 * MiB))
    assert (cgroup.path / "memory.max").read_text() == str(316 * MiB)
    assert (cgroup.path / "memory.swap.max").read_text() == "0"
    assert (cgroup.path / "pids.max").read_text() == "32"
    (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
    assert delegated_cgroup()[1].endswith("does not enable memory, pids for its children")
