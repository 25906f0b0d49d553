"""The sandboxed tools: confinement, limits, answers to unknown tools and bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.rl.agent import TOOL_NAMES, SandboxLimits, ToolBox


@pytest.fixture
def box(tmp_path: Path) -> ToolBox:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "test_mod.py").write_text(
        "from pkg.mod import VALUE\n\ndef test_value():\n    assert VALUE == 1\n"
    )
    return ToolBox(tmp_path, SandboxLimits(test_timeout_s=30, max_output_chars=200))


def test_read_write_list(box: ToolBox) -> None:
    assert box.call("list_dir", json.dumps({"path": "."})).content == "pkg/\ntest_mod.py"
    wrote = box.call("write_file", json.dumps({"path": "pkg/new.py", "content": "X = 2\n"}))
    assert wrote.ok
    assert box.call("read_file", json.dumps({"path": "pkg/new.py"})).content == "X = 2\n"


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "pkg/../../x"])
def test_paths_cannot_leave_the_sandbox(box: ToolBox, path: str) -> None:
    outcome = box.call("read_file", json.dumps({"path": path}))
    assert not outcome.ok and "Invalid arguments" in outcome.content


def test_symlink_out_of_the_sandbox_is_refused(box: ToolBox, tmp_path: Path) -> None:
    (box.root / "escape").symlink_to(tmp_path.parent)
    outcome = box.call("list_dir", json.dumps({"path": "escape"}))
    assert not outcome.ok and "leaves the repository" in outcome.content


def test_unknown_tool_is_answered_with_the_tool_list(box: ToolBox) -> None:
    outcome = box.call("search_web", "{}")
    assert not outcome.ok
    assert outcome.content.startswith("Tool not found")
    assert all(name in outcome.content for name in TOOL_NAMES)


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", '{"path": 3}'])
def test_bad_arguments_are_answered(box: ToolBox, raw: str) -> None:
    outcome = box.call("read_file", raw)
    assert not outcome.ok and outcome.content.startswith("Invalid arguments for read_file")


def test_output_is_truncated(box: ToolBox) -> None:
    box.call("write_file", json.dumps({"path": "big.txt", "content": "x" * 1000}))
    content = box.call("read_file", json.dumps({"path": "big.txt"})).content
    assert content.startswith("x" * 200) and "[... truncated 800 characters]" in content


def test_run_tests_passes_and_leaves_no_bytecode(box: ToolBox) -> None:
    outcome = box.call("run_tests", "{}")
    assert outcome.ok and "1 passed" in outcome.content
    assert not list(box.root.rglob("__pycache__")) and not list(box.root.rglob(".pytest_cache"))


def test_run_tests_wall_time_kills_the_process_group(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(
        "import subprocess, time\n\ndef test_hang():\n"
        "    subprocess.Popen(['sleep', '600'])\n    time.sleep(600)\n"
    )
    box = ToolBox(tmp_path, SandboxLimits(test_timeout_s=3))
    outcome = box.call("run_tests", "{}")
    assert not outcome.ok and "[killed after 3s]" in outcome.content


def test_run_tests_memory_limit(tmp_path: Path) -> None:
    (tmp_path / "test_big.py").write_text(
        "def test_big():\n    block = bytearray(3 * 1024 ** 3)\n    assert block\n"
    )
    box = ToolBox(tmp_path, SandboxLimits(max_memory_bytes=1024**3))
    outcome = box.call("run_tests", "{}")
    assert not outcome.ok and "MemoryError" in outcome.content


def test_finish_ends(box: ToolBox) -> None:
    assert box.call("finish", "{}").finished
