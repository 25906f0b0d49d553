"""The local stack: embedded Valkey, the shared vLLM engine, and what runs on top.

Components start in order and stop in reverse; if any dies, the whole stack stops, so a
developer never keeps using half a platform without noticing.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from deploy.settings import DeploySettings
from serving.engine import engine_for_variant
from serving.process import ManagedProcess, ServerStartError
from serving.settings import ServingSettings
from serving.tiny import build_tiny_checkpoint
from serving.valkey import start_valkey

DEV_ORG = "local"


class LocalStack:
    def __init__(self, settings: DeploySettings, say: Any = print) -> None:
        self.settings = settings
        self.say = say
        self.valkey: Any = None
        self.redis_url = settings.redis_url
        self.vllm_url = ""
        self.processes: list[ManagedProcess] = []
        # A fresh admin token per run: it lives only in this process and the gateway's env.
        self.admin_token = secrets.token_urlsafe(32)

    @property
    def state(self) -> Path:
        return self.settings.state_dir

    @property
    def gateway_url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.gateway_port}"

    @property
    def base_url(self) -> str:
        return f"{self.gateway_url}/v1"

    @property
    def dev_key_path(self) -> Path:
        return self.state / "dev-api-key"

    def model_dir(self) -> Path:
        if self.settings.model_dir is not None:
            return self.settings.model_dir
        tiny = self.state / "models" / "tiny"
        if not (tiny / "config.json").exists():
            self.say(f"building the tiny checkpoint in {tiny}")
            build_tiny_checkpoint(tiny, seed=0)
        return tiny

    def child_env(self) -> dict[str, str]:
        """What every service started here shares: one Redis, state under state_dir."""
        assert self.redis_url is not None
        return {
            "CSTACK_REDIS_URL": self.redis_url,
            "CSTACK_UPSTREAM_URL": self.vllm_url,
            "CSTACK_LEDGER_URL": f"sqlite:///{(self.state / 'ledger.db').resolve()}",
            "CSTACK_USAGE_SPOOL_DIR": str(self.state / "usage-spool"),
            "CSTACK_BEAT_SCHEDULE_FILE": str(self.state / "celerybeat-schedule"),
        }

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self._start_redis()
        self._start_vllm()
        env = self.child_env()
        self._migrate_ledger(env)
        self._start(
            self._cstack("gateway", ["gateway", "--host", self.settings.host, "--port",
                                     str(self.settings.gateway_port)],
                         env={**env, "CSTACK_ADMIN_TOKEN": self.admin_token},
                         health_url=f"{self.gateway_url}/readyz"),
            timeout_s=120,
        )  # fmt: skip
        self._start(self._cstack("billing worker", ["worker", "billing"], env=env), 120)
        self._start(self._cstack("billing beat", ["beat"], env=env), 120)
        self.dev_key_path.write_text(self._provision_dev_key() + "\n")
        self.dev_key_path.chmod(0o600)
        self.say(f"API key for org {DEV_ORG!r} written to {self.dev_key_path}")

    def _start_redis(self) -> None:
        if self.redis_url is not None:
            self.say("redis: external (CSTACK_REDIS_URL)")
            return
        self.valkey = start_valkey(self.state / "valkey")
        self.redis_url = str(self.valkey.connection_url)
        self.say(f"embedded valkey: {self.redis_url}")

    def _start_vllm(self) -> None:
        if self.settings.vllm_url:
            self.vllm_url = self.settings.vllm_url.rstrip("/")
            self.say(f"vLLM: external {self.vllm_url} (CSTACK_VLLM_URL)")
            return
        engine = engine_for_variant(
            "shared",
            self.model_dir(),
            self.settings.vllm_port,
            settings=ServingSettings(),
            log_path=self.state / "logs" / "vllm.log",
            host=self.settings.host,
        )
        self._start(engine, self.settings.vllm_start_timeout_s)
        self.vllm_url = engine.base_url

    def _cstack(
        self, name: str, args: list[str], env: dict[str, str], health_url: str | None = None
    ) -> ManagedProcess:
        log = self.state / "logs" / f"{name.replace(' ', '-')}.log"
        command = [sys.executable, "-m", "deploy.cli", *args]
        return ManagedProcess(name, command, log, health_url=health_url, env=env)

    def _migrate_ledger(self, env: dict[str, str]) -> None:
        """The ledger's schema before the gateway starts: its GET /v1/usage only queries,
        and the billing worker, which would migrate too, starts after it."""
        log = self.state / "logs" / "billing-migrate.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            done = subprocess.run(
                [sys.executable, "-m", "deploy.cli", "billing", "migrate"],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        if done.returncode != 0:
            raise ServerStartError(f"cstack billing migrate failed (log: {log})")

    def _start(self, process: ManagedProcess, timeout_s: float) -> None:
        self.say(f"starting {process.name} (log: {process.log_path})")
        self.processes.append(process)
        process.start()
        process.wait_healthy(timeout_s)

    def _provision_dev_key(self) -> str:
        """Create the local org (once) and a fresh API key for it through the admin API."""
        headers = {"authorization": f"Bearer {self.admin_token}"}
        with httpx.Client(base_url=self.gateway_url, headers=headers, timeout=10) as admin:
            org = admin.post("/admin/orgs", json={"org_id": DEV_ORG, "name": "local dev"})
            if org.status_code not in (201, 409):  # 409: kept from an earlier run
                org.raise_for_status()
            key = admin.post(f"/admin/orgs/{DEV_ORG}/keys", json={"name": "cstack up"})
            key.raise_for_status()
            return str(key.json()["key"])

    def dev_key(self) -> str:
        return self.dev_key_path.read_text().strip()

    def wait(self) -> ManagedProcess:
        """Block until a component dies (the caller stops on signals); return that one."""
        while True:
            for process in self.processes:
                if not process.running():
                    return process
            time.sleep(1.0)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
