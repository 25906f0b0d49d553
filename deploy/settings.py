"""Settings of the local stack runner (env prefix ``CSTACK_``)."""

from __future__ import annotations

from pathlib import Path

from serving.settings import CstackSettings


class DeploySettings(CstackSettings):
    #: Checkpoint to serve; empty means the tiny checkpoint under state_dir (built if absent).
    model_dir: Path | None = None
    #: A vLLM server already running (e.g. on a GPU host); when set, `cstack up` starts none.
    vllm_url: str | None = None
    gateway_port: int = 8000
    #: The gateway's internal listener (/metrics, /admin); unset: a free port each start.
    gateway_internal_port: int | None = None
    vllm_port: int = 8100
