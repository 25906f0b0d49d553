"""Session-wide real services: the tiny checkpoint, one vLLM server, an embedded Valkey.

One vLLM server serves every test that needs it (it takes about two minutes to start on
2 cores). Set CSTACK_TEST_VLLM_URL to reuse a server already running the seed-0 tiny
checkpoint while developing; CI always starts its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.process import ManagedProcess, free_port
from serving.valkey import start_valkey
from tests.support.cstack import cstack_command


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serving.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def vllm_url(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (``http://host:port``) of a real vLLM server started by `cstack serve`."""
    reuse = os.environ.get("CSTACK_TEST_VLLM_URL")
    if reuse:
        yield reuse.rstrip("/")
        return
    port = free_port()
    server = ManagedProcess(
        "cstack serve",
        # --weight-sync: the RL tests push weights into this engine (and restore them).
        cstack_command("serve", "--variant", "shared", "--model", str(tiny_model),
                       "--port", str(port), "--weight-sync"),
        log_path=tmp_path_factory.mktemp("logs") / "cstack-serve.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )  # fmt: skip
    server.start()
    try:
        server.wait_healthy(timeout_s=900)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
    # `cstack serve` must have stopped vLLM and exited by itself on SIGTERM (128 + 15),
    # not been killed after the grace period.
    assert server.process is not None
    code = server.process.returncode
    assert code == 143, f"cstack serve did not exit cleanly on SIGTERM (status {code})"


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[object]:
    """A real embedded Valkey (the product's default Redis) for the whole session."""
    server = start_valkey()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(valkey_server: object) -> str:
    return str(valkey_server.connection_url)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The machine's PostgreSQL (trust auth, database ``test``)."""
    return os.environ.get(
        "CSTACK_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
