"""Settings of the local stack runner (env prefix ``CSTACK_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class DeploySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CSTACK_", extra="ignore")

    #: An external Redis; when unset `cstack up` starts an embedded Valkey.
    redis_url: str | None = None
    #: Where `cstack up` keeps its model, logs and embedded Valkey data.
    state_dir: Path = Path(".cstack")
    #: Checkpoint to serve; empty means the tiny checkpoint under state_dir (built if absent).
    model_dir: Path | None = None
    #: A vLLM server already running (e.g. on a GPU host); when set, `cstack up` starts none.
    vllm_url: str | None = None
    host: str = "127.0.0.1"
    gateway_port: int = 8000
    #: The gateway's internal listener (/metrics, /admin); unset: a free port each start.
    gateway_internal_port: int | None = None
    vllm_port: int = 8100
    vllm_start_timeout_s: float = 900.0
