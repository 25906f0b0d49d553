"""The local stack: embedded Valkey, the shared vLLM engine, and what runs on top.

Components start in order and stop in reverse; if any dies, the whole stack stops, so a
developer never keeps using half a platform without noticing.

Every service binds to ``host`` (127.0.0.1 by default), and the ones with credentials
require them, because other users of the machine reach loopback ports too: Valkey its
password and vLLM its API key, both generated at the first start and kept in the state
directory (mode 0600), and the gateway's admin API its per-run token on the internal
port. Children get the credentials in their environment, never on a command line, and
nothing here prints them.
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
from serving.process import ManagedProcess, ServerStartError, free_port
from serving.redact import redact_url
from serving.settings import ServingSettings
from serving.tiny import build_tiny_checkpoint
from serving.valkey import read_or_create_secret, start_valkey, write_private

DEV_ORG = "local"


class LocalStack:
    def __init__(self, settings: DeploySettings, say: Any = print) -> None:
        self.settings = settings
        self.say = say
        self.valkey: Any = None
        self.redis_url = settings.redis_url
        self.vllm_url = ""
        #: What vLLM requires on /v1/* (set once vLLM is known; None: it requires none).
        self.vllm_api_key: str | None = None
        self.internal_port = settings.gateway_internal_port or free_port(settings.host)
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
    def internal_url(self) -> str:
        """The gateway's internal listener: /metrics and the /admin API."""
        return f"http://{self.settings.host}:{self.internal_port}"

    @property
    def dev_key_path(self) -> Path:
        return self.state / "dev-api-key"

    @property
    def redis_url_path(self) -> Path:
        """The embedded Valkey's URL with its password, while the stack runs: how the
        `cstack keys` and `cstack billing` commands find it (``deploy.cli``)."""
        return redis_url_file(self.state)

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
        # Owner-only when created here: logs and the ledger hold request and usage data.
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.start_redis()
        self._start_vllm()
        env = self.child_env()
        self._migrate_ledger(env)
        # The admin token and vLLM's key go to the gateway alone: nothing else uses them.
        gateway_env = {
            **env,
            "CSTACK_ADMIN_TOKEN": self.admin_token,
            "CSTACK_INTERNAL_PORT": str(self.internal_port),
        }
        if self.vllm_api_key:
            gateway_env["CSTACK_UPSTREAM_API_KEY"] = self.vllm_api_key
        self._start(
            self._cstack("gateway", ["gateway", "--host", self.settings.host, "--port",
                                     str(self.settings.gateway_port)],
                         env=gateway_env, health_url=f"{self.gateway_url}/readyz"),
            timeout_s=120,
        )  # fmt: skip
        self.say(f"gateway metrics and admin API: {self.internal_url} (/metrics, /admin)")
        self._start(self._cstack("billing worker", ["worker", "billing"], env=env), 120)
        self._start(self._cstack("billing beat", ["beat"], env=env), 120)
        write_private(self.dev_key_path, self._provision_dev_key() + "\n")
        self.say(f"API key for org {DEV_ORG!r} written to {self.dev_key_path}")

    def start_redis(self) -> None:
        if self.redis_url is not None:
            self.say("redis: external (CSTACK_REDIS_URL)")
            return
        # The same password every start: the data directory persists, and so do the
        # URLs of whatever a developer pointed at it.
        password = read_or_create_secret(self.state / "valkey-password")
        self.valkey = start_valkey(self.state / "valkey", password)
        self.redis_url = self.valkey.connection_url
        write_private(self.redis_url_path, self.redis_url + "\n")
        self.say(
            f"embedded valkey: {redact_url(self.redis_url)} "
            f"(URL with its password: {self.redis_url_path})"
        )

    def _start_vllm(self) -> None:
        serving = ServingSettings()
        configured = serving.vllm_api_key.get_secret_value() if serving.vllm_api_key else None
        if self.settings.vllm_url:
            self.vllm_url = self.settings.vllm_url.rstrip("/")
            self.vllm_api_key = configured
            keyed = "with" if configured else "without"
            self.say(f"vLLM: external {self.vllm_url} (CSTACK_VLLM_URL), {keyed} an API key")
            return
        key_path = self.state / "vllm-api-key"
        self.vllm_api_key = configured or read_or_create_secret(key_path)
        engine = engine_for_variant(
            "shared",
            self.model_dir(),
            self.settings.vllm_port,
            settings=serving,
            log_path=self.state / "logs" / "vllm.log",
            host=self.settings.host,
            api_key=self.vllm_api_key,
        )
        self._start(engine, self.settings.vllm_start_timeout_s)
        self.vllm_url = engine.base_url
        where = "CSTACK_VLLM_API_KEY" if configured else str(key_path)
        self.say(f"vLLM: {self.vllm_url} (API key: {where})")

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
        with httpx.Client(base_url=self.internal_url, headers=headers, timeout=10) as admin:
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
            self.redis_url_path.unlink(missing_ok=True)
            self.valkey.stop()
            self.valkey = None


def redis_url_file(state_dir: Path) -> Path:
    """Where a running `cstack up` keeps its embedded Valkey's URL (mode 0600)."""
    return state_dir / "redis-url"


def running_stack_redis_url(settings: DeploySettings) -> str | None:
    """The Redis URL of the `cstack up` running from this state directory, if any."""
    try:
        return redis_url_file(settings.state_dir).read_text().strip() or None
    except OSError:
        return None
