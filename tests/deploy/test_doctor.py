"""`cstack doctor` and the checks `cstack up` and `make install` run before they start:
a clear line and exit status 1 for what would fail later, exit 0 on a healthy machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.doctor import FAIL, PYTHON_BELOW, PYTHON_MIN, check_python
from serving.process import free_port
from tests.support.commands import cstack_command

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """This machine's environment with the stack's settings under the test's control."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTACK_")}
    env.update(
        CSTACK_STATE_DIR=str(tmp_path / "state"),
        CSTACK_GATEWAY_PORT=str(free_port()),
        CSTACK_VLLM_PORT=str(free_port()),
    )
    env.update(settings)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def _lines(done: subprocess.CompletedProcess[str], status: str) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(status)]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something listens on, as a stack left running would."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def test_a_healthy_machine_passes(tmp_path: Path) -> None:
    done = _run(cstack_command("doctor"), _env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    names = [line.split()[1] for line in done.stdout.splitlines()]
    assert names[:4] == ["python:", "port", "port", "disk:"]
    assert not _lines(done, FAIL)


def test_a_taken_port_fails_with_one_line_saying_what_to_do(
    tmp_path: Path, taken_port: int
) -> None:
    done = _run(cstack_command("doctor"), _env(tmp_path, CSTACK_GATEWAY_PORT=str(taken_port)))
    assert done.returncode == 1
    [failed] = _lines(done, FAIL)
    assert f"127.0.0.1:{taken_port} (gateway) is taken" in failed
    assert "set CSTACK_GATEWAY_PORT to a free port" in failed


def test_up_stops_at_a_taken_port_before_starting_anything(tmp_path: Path, taken_port: int) -> None:
    done = _run(cstack_command("up"), _env(tmp_path, CSTACK_VLLM_PORT=str(taken_port)))
    assert done.returncode == 1
    [failed] = _lines(done, FAIL)
    assert f"127.0.0.1:{taken_port} (vLLM) is taken" in failed
    assert "valkey" not in done.stdout and not (tmp_path / "state").exists()


def test_an_unreachable_redis_fails_without_printing_its_password(tmp_path: Path) -> None:
    password = "doctor-test-password"
    url = f"redis://:{password}@127.0.0.1:{free_port()}/0"  # nothing listens there
    done = _run(cstack_command("doctor"), _env(tmp_path, CSTACK_REDIS_URL=url))
    assert done.returncode == 1
    [failed] = _lines(done, FAIL)
    assert failed.startswith(f"{FAIL}  redis: redis://:***@127.0.0.1:")
    assert "does not answer" in failed and "CSTACK_REDIS_URL" in failed
    assert password not in done.stdout + done.stderr


def test_a_redis_with_a_password_passes(tmp_path: Path, redis_url: str) -> None:
    done = _run(cstack_command("doctor"), _env(tmp_path, CSTACK_REDIS_URL=redis_url))
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(line.startswith("ok    redis: ") for line in done.stdout.splitlines())
    password = redis_url.split("@")[0].rsplit(":", 1)[1]
    assert password not in done.stdout + done.stderr


def test_a_wrong_redis_password_is_named(tmp_path: Path, redis_url: str) -> None:
    wrong = redis_url.replace("@", "x@", 1)
    done = _run(cstack_command("doctor"), _env(tmp_path, CSTACK_REDIS_URL=wrong))
    assert done.returncode == 1
    [failed] = _lines(done, FAIL)
    assert "refused the credentials" in failed


def test_an_unreachable_postgresql_ledger_fails(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://cstack:pg-secret@127.0.0.1:{free_port()}/ledger"
    done = _run(cstack_command("doctor"), _env(tmp_path, CSTACK_LEDGER_URL=url))
    assert done.returncode == 1
    [failed] = _lines(done, FAIL)
    assert failed.startswith(f"{FAIL}  postgresql: postgresql+psycopg://cstack:***@127.0.0.1:")
    assert "pg-secret" not in done.stdout + done.stderr


def test_before_install_needs_only_the_standard_library(tmp_path: Path) -> None:
    """`make install` runs it with the system Python, before the venv has anything:
    ``-S`` leaves site-packages (pydantic, redis, rich...) out of reach."""
    done = _run([sys.executable, "-S", "-m", "deploy.doctor", "--before-install",
                 "--venv", str(tmp_path / "venv")], _env(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[1] for line in done.stdout.splitlines()] == ["python:", "disk:"]


def test_an_unsupported_python_says_which_to_install() -> None:
    check = check_python((3, 10, 12))
    assert check.status == FAIL
    assert "3.10.12" in check.line and "make up PYTHON=python3.11" in check.line


def test_the_supported_pythons_are_pyprojects() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = ">={}.{},<{}.{}".format(*PYTHON_MIN, *PYTHON_BELOW)
    assert pyproject["project"]["requires-python"] == wanted
