"""The other gateways `bench/gateway_overhead.py` sets beside ours, each started in front of
the same upstream, and the process helpers they share with it.

Each peer lives in a venv of its own (their pins clash with ours):

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install vllm-router==0.1.17 \
        tensorzero==2026.6.0
    python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install \
        'litellm[proxy]==1.100.0'

- LiteLLM's proxy: no database, one worker, a master key;
- vLLM's router (Rust): round robin, no auth, no metering;
- TensorZero's gateway (Rust, inside its wheel, started as its Python client starts it:
  ``tensorzero._start_http_gateway`` with no ClickHouse, Postgres or Valkey, so no
  observability either): its OpenAI-compatible endpoint, which names a model
  ``tensorzero::model_name::NAME`` and refuses ``n`` other than 1.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LITELLM_KEY = "sk-bench-master-key"
#: TensorZero's name for the upstream model (its config below), as its requests give it.
TENSORZERO_MODEL = "tensorzero::model_name::composer"
TENSORZERO_PATH = "/openai/v1/chat/completions"
#: Started in the peers' venv: prints the gateway's base URL, then holds it up.
TENSORZERO_LAUNCHER = """
import sys, time, tensorzero
gateway = tensorzero._start_http_gateway(config_file=sys.argv[1], clickhouse_url=None,
                                         postgres_url=None, valkey_url=None, async_setup=False)
print(gateway.base_url, flush=True)
while True:
    time.sleep(3600)
"""


def start_process(
    args: list[str],
    env: dict[str, str | None] | None = None,
    log: Path | None = None,
    cwd: Path = ROOT,
) -> subprocess.Popen[bytes]:
    """``env``: variables to set, or (None) to remove. stderr stays on the terminal (errors
    show) unless a log is given; stdout is never read."""
    merged = {**os.environ, **(env or {})}
    environment = {name: value for name, value in merged.items() if value is not None}
    out = log.open("ab") if log else None
    return subprocess.Popen(
        args,
        cwd=cwd,
        env=environment,
        stdout=out or subprocess.DEVNULL,
        stderr=out,
        start_new_session=True,
    )


def wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with status {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


def start_litellm(
    executable: str, port: int, upstream_port: int, directory: Path
) -> subprocess.Popen[bytes]:
    """LiteLLM's proxy in front of the same upstream: no database, one worker, a master key."""
    import yaml

    config = {
        "model_list": [
            {
                "model_name": "composer-2.5",
                "litellm_params": {
                    "model": "openai/composer-2.5",
                    "api_base": f"http://127.0.0.1:{upstream_port}/v1",
                    "api_key": "sk-upstream",
                },
            }
        ],
        "general_settings": {"master_key": LITELLM_KEY},
    }
    path = directory / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        # No network here: the packaged model price map, not a download at start.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        # No database (its DATABASE_URL unset): keys other than the master key need one.
        "DATABASE_URL": None,
    }
    command = [executable, "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    process = start_process([*command, "--num_workers", "1"], env, directory / "litellm.log")
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", process, timeout_s=300)
    return process


def start_vllm_router(
    executable: str, port: int, upstream_port: int, directory: Path
) -> subprocess.Popen[bytes]:
    """vLLM's router in front of the same upstream: round robin, no key, no metering."""
    command = [
        executable,
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--worker-urls", f"http://127.0.0.1:{upstream_port}"),
        *("--policy", "round_robin", "--log-level", "error"),
    ]
    process = start_process(command, {}, directory / "vllm-router.log")
    wait_http(f"http://127.0.0.1:{port}/health", process, timeout_s=120)
    return process


def start_tensorzero(
    python: str, upstream_port: int, directory: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """TensorZero's gateway in front of the same upstream (``python``: the peers' venv's
    interpreter); returns its process and port."""
    config = directory / "tensorzero.toml"
    config.write_text(
        '[models.composer]\nrouting = ["bench"]\n\n'
        '[models.composer.providers.bench]\ntype = "openai"\nmodel_name = "composer-2.5"\n'
        f'api_base = "http://127.0.0.1:{upstream_port}/v1/"\napi_key_location = "none"\n'
    )
    log = (directory / "tensorzero.log").open("ab")
    process = subprocess.Popen(
        [python, "-c", TENSORZERO_LAUNCHER, str(config)],
        env={**os.environ, "RUST_LOG": "error"},
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    assert process.stdout is not None
    base_url = process.stdout.readline().decode().strip()  # http://127.0.0.1:PORT/openai/v1
    if not base_url:
        raise RuntimeError(f"TensorZero's gateway did not start; its log: {log.name}")
    # It prints its URL once it listens. (Its /health answers 503 without a database.)
    return process, int(base_url.split(":")[2].split("/")[0])
