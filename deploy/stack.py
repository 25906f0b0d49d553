"""The local stack: embedded Valkey, the shared vLLM engine, and what runs on top.

vLLM takes longest to start (importing itself three times over, one process after the
other), so the gateway and the billing processes start while it does; the gateway is
ready once its health checks see vLLM. Components stop in the reverse order; if any dies,
the whole stack stops, so a developer never keeps using half a platform without noticing.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from deploy.progress import Progress, Step
from deploy.settings import DeploySettings
from serving.engine import engine_for_variant
from serving.process import ManagedProcess, ServerStartError, StopSignals, free_port
from serving.redact import redact_url
from serving.settings import ServingSettings
from serving.tiny import build_tiny_checkpoint
from serving.valkey import read_or_create_secret, start_valkey, write_private

DEV_ORG = "local"


class LocalStack:
    def __init__(self, settings: DeploySettings, say: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.say = say
        self.valkey: Any = None
        #: An external Redis given by CSTACK_REDIS_URL; None: an embedded Valkey started here.
        self.redis_url: str | None = settings.redis_url if settings.redis_url_given() else None
        self.vllm_url = ""
        #: What vLLM requires on /v1/* (set once vLLM is known; None: it requires none).
        self.vllm_api_key: str | None = None
        #: Where that key comes from, to tell the developer (never the key itself).
        self.vllm_key_source = ""
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

    @property
    def tiny_model_dir(self) -> Path:
        """The checkpoint served when CSTACK_MODEL_DIR is unset: built at the first start."""
        return self.state / "models" / "tiny"

    def model_dir(self, progress: Progress) -> Path:
        if self.settings.model_dir is not None:
            return self.settings.model_dir
        tiny = self.tiny_model_dir
        if not (tiny / "config.json").exists():
            with progress.step(f"tiny checkpoint ({tiny})", "importing torch") as step:
                build_tiny_checkpoint(tiny, seed=0, report=step.update)
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

    def start(self, progress: Progress) -> None:
        # Owner-only when created here: logs and the ledger hold request and usage data.
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        with progress.step("valkey" if self.redis_url is None else "redis"):
            self.start_redis()
        vllm = self._launch_vllm(progress)
        env = self.child_env()
        with progress.step("ledger", "migrating", self.state / "logs" / "billing-migrate.log"):
            self._migrate_ledger(env)
        # The admin token and vLLM's key go to the gateway alone: nothing else uses them.
        gateway_env = {
            **env,
            "CSTACK_ADMIN_TOKEN": self.admin_token,
            "CSTACK_INTERNAL_PORT": str(self.internal_port),
        }
        if self.vllm_api_key:
            gateway_env["CSTACK_UPSTREAM_API_KEY"] = self.vllm_api_key
        # Up means live (/healthz) here: readiness needs vLLM, which may still be starting.
        gateway = self._launch(progress, self._cstack(
            "gateway", ["gateway", "--host", self.settings.host, "--port",
                        str(self.settings.gateway_port)],
            env=gateway_env, health_url=f"{self.gateway_url}/healthz"))  # fmt: skip
        billing = [
            self._launch(progress, self._cstack("billing worker", ["worker", "billing"], env=env)),
            self._launch(progress, self._cstack("billing beat", ["beat"], env=env)),
        ]
        gateway.wait(timeout_s=120)
        self.say(f"gateway metrics and admin API: {self.internal_url} (/metrics, /admin)")
        for started in billing:
            started.wait(timeout_s=120)
        write_private(self.dev_key_path, self._provision_dev_key() + "\n")
        self.say(f"API key for org {DEV_ORG!r} written to {self.dev_key_path}")
        if vllm is not None:
            vllm.wait(self.settings.vllm_start_timeout_s)
            self.say(f"vLLM: {self.vllm_url} (API key: {self.vllm_key_source})")
        self._wait_gateway_ready(gateway.process, timeout_s=60)

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

    def _launch_vllm(self, progress: Progress) -> _Launched | None:
        """Start vLLM without waiting for it (None: CSTACK_VLLM_URL names one running)."""
        serving = ServingSettings()
        configured = serving.vllm_api_key.get_secret_value() if serving.vllm_api_key else None
        if self.settings.vllm_url:
            self.vllm_url = self.settings.vllm_url.rstrip("/")
            self.vllm_api_key = configured
            keyed = "with" if configured else "without"
            self.say(f"vLLM: external {self.vllm_url} (CSTACK_VLLM_URL), {keyed} an API key")
            return None
        key_path = self.state / "vllm-api-key"
        self.vllm_api_key = configured or read_or_create_secret(key_path)
        self.vllm_key_source = "CSTACK_VLLM_API_KEY" if configured else str(key_path)
        model = self.model_dir(progress)
        engine = engine_for_variant(
            "shared",
            model,
            self.settings.vllm_port,
            settings=serving,
            log_path=self.state / "logs" / "vllm.log",
            host=self.settings.host,
            api_key=self.vllm_api_key,
            # Compiling the tiny random model buys nothing and costs most of a minute.
            eager=model == self.tiny_model_dir,
        )
        self.vllm_url = engine.base_url
        return self._launch(progress, engine, phase="importing vLLM")

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

    def _launch(
        self, progress: Progress, process: ManagedProcess, phase: str = "starting"
    ) -> _Launched:
        """Start ``process`` and its progress step; the caller waits for it and ends the step."""
        self.processes.append(process)
        process.start()
        # Phases from the log: vLLM's (``VllmServer.phase_of``); the others name none.
        step = progress.begin(process.name, phase, log=process.log_path, watch=process.phase)
        return _Launched(process, step)

    def _wait_gateway_ready(self, gateway: ManagedProcess, timeout_s: float) -> None:
        """The gateway's /readyz: 200 once its health checks (every second) see vLLM."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not gateway.running():
                    raise ServerStartError(
                        f"gateway exited: {gateway.failure_cause()} (log: {gateway.log_path})"
                    )
                try:
                    if client.get(f"{self.gateway_url}/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
        raise ServerStartError(
            f"gateway not ready within {timeout_s:.0f}s: its health checks do not reach vLLM "
            f"at {self.vllm_url} (log: {gateway.log_path})"
        )

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

    def wait(self, stop_signals: StopSignals) -> ManagedProcess:
        """Block until a component dies and return that one, or until a stop signal
        arrives (StopRequested), even one whose first raise was swallowed."""
        while True:
            stop_signals.raise_if_received()
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


@dataclass(frozen=True)
class _Launched:
    """A started process and the progress step that shows it until it is up."""

    process: ManagedProcess
    step: Step

    def wait(self, timeout_s: float) -> None:
        """Until the process is up: its step is then done, or failed if it never is."""
        try:
            self.process.wait_healthy(timeout_s)
        except ServerStartError:
            self.step.fail()
            raise
        self.step.done()


def redis_url_file(state_dir: Path) -> Path:
    """Where a running `cstack up` keeps its embedded Valkey's URL (mode 0600)."""
    return state_dir / "redis-url"


def running_stack_redis_url(settings: DeploySettings) -> str | None:
    """The Redis URL of the `cstack up` running from this state directory, if any."""
    try:
        return redis_url_file(settings.state_dir).read_text().strip() or None
    except OSError:
        return None
