"""The local stack: embedded Valkey, the shared vLLM engine, and what runs on top.

Components start in order and stop in reverse; if any dies, the whole stack stops, so a
developer never keeps using half a platform without noticing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from deploy.settings import DeploySettings
from serving import ManagedProcess, ServingSettings, build_tiny_checkpoint
from serving.engine import engine_for_variant


class LocalStack:
    def __init__(self, settings: DeploySettings, say: Any = print) -> None:
        self.settings = settings
        self.say = say
        self.valkey: Any = None
        self.redis_url = settings.redis_url
        self.processes: list[ManagedProcess] = []
        self.stopping = threading.Event()

    @property
    def logs(self) -> Path:
        return self.settings.state_dir / "logs"

    def model_dir(self) -> Path:
        if self.settings.model_dir is not None:
            return self.settings.model_dir
        tiny = self.settings.state_dir / "models" / "tiny"
        if not (tiny / "config.json").exists():
            self.say(f"building the tiny checkpoint in {tiny}")
            build_tiny_checkpoint(tiny, seed=0)
        return tiny

    def start(self) -> None:
        if self.redis_url is None:
            self.valkey = start_valkey(self.settings.state_dir / "valkey")
            self.redis_url = str(self.valkey.connection_url)
            self.say(f"embedded valkey: {self.redis_url}")
        else:
            self.say("redis: external (CSTACK_REDIS_URL)")
        if self.settings.vllm_url:
            self.vllm_url = self.settings.vllm_url.rstrip("/")
            self.say(f"vLLM: external {self.vllm_url} (CSTACK_VLLM_URL)")
            return
        engine = engine_for_variant(
            "shared",
            self.model_dir(),
            self.settings.vllm_port,
            settings=ServingSettings(),
            log_path=self.logs / "vllm.log",
            host=self.settings.host,
        )
        self._start(engine, self.settings.vllm_start_timeout_s)
        self.vllm_url = engine.base_url

    @property
    def base_url(self) -> str:
        return f"{self.vllm_url}/v1"

    def _start(self, process: ManagedProcess, timeout_s: float) -> None:
        self.say(f"starting {process.name} (log: {process.log_path})")
        self.processes.append(process)
        process.start()
        process.wait_healthy(timeout_s)

    def wait(self) -> ManagedProcess | None:
        """Block until asked to stop or a component dies; return the one that died."""
        while not self.stopping.wait(1.0):
            for process in self.processes:
                if not process.running():
                    return process
        return None

    def stop(self) -> None:
        self.stopping.set()
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None


def start_valkey(data_dir: Path) -> Any:
    from deploy.valkey import start_embedded_valkey

    return start_embedded_valkey(data_dir)
