"""Push new weights into running vLLM engines without restarting them.

Uses vLLM's own endpoints (served when the engine runs with VLLM_SERVER_DEV_MODE=1):
``/pause?mode=wait`` lets in-flight requests finish on the old weights, ``/collective_rpc``
runs our worker extension's exact reload (vllm_extension.py: vLLM's ``reload_weights``,
of the MTP drafter too, plus the MoE repack it skips on CPU) on every worker,
``/reset_prefix_cache`` drops KV computed with the old weights, ``/update_weight_version``
labels the engine, ``/resume`` serves again. The version gate (gate.py) brackets it so
that no turn straddles the swap and every turn records the version that produced it.

Every request carries the engines' API key (``CSTACK_VLLM_API_KEY`` or ``VLLM_API_KEY``,
serving's setting). vLLM checks it only on ``/v1/*``, not on these endpoints: what keeps
them from everyone else is that only the trainer and the gateway can reach an engine
(the chart's NetworkPolicy; a loopback address locally), and the gateway never forwards
them.

An engine URL may name several replicas: a Kubernetes headless Service resolves to every
pod's address, and each push resolves it again and updates each replica.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import torch

from serving.settings import ServingSettings
from training.rl.rollouts.gate import PolicyVersionGate
from training.rl.rollouts.vllm_extension import PROTOCOL_VERSION, WORKER_EXTENSION
from training.rl.rollouts.weight_transport import (
    Bucket,
    listen_socket,
    open_group,
    plan_buckets,
    send_buckets,
)


class WeightSyncError(RuntimeError):
    """An engine refused a step of the update; the message names the engine and step."""


def _check(response: httpx.Response, url: str, step: str) -> None:
    if response.status_code == 404:
        raise WeightSyncError(
            f"{url}: {step} not found; start vLLM with VLLM_SERVER_DEV_MODE=1 for weight sync"
        )
    if response.status_code >= 400:
        raise WeightSyncError(
            f"{url}: {step} failed ({response.status_code}): {response.text[:200]}"
        )


def replica_urls(url: str) -> list[str]:
    """One URL per address ``url``'s host resolves to (IPv4 first, as cluster DNS answers).

    A host with one address (an IP, ``localhost``, a ClusterIP Service) keeps its URL.
    """
    url = url.rstrip("/")
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    try:
        ipaddress.ip_address(host)
        return [url]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise WeightSyncError(f"{url}: cannot resolve {host!r}: {err}") from err
    for family in (socket.AF_INET, socket.AF_INET6):
        addresses = sorted({str(info[4][0]) for info in infos if info[0] == family})
        if len(addresses) > 1:
            bracket = "[{}]" if family == socket.AF_INET6 else "{}"
            return [f"{parts.scheme}://{bracket.format(a)}:{port}" for a in addresses]
        if addresses:
            break
    return [url]


def _configured_api_key() -> str | None:
    key = ServingSettings().vllm_api_key
    return key.get_secret_value() if key is not None else None


@dataclass
class VllmWeightSync:
    engine_urls: list[str]
    gate: PolicyVersionGate
    timeout_s: float = 600.0
    #: The engines' API key; by default serving's setting (unset: none is sent).
    api_key: str | None = field(default_factory=_configured_api_key, repr=False)
    #: A streamed push (``push_weights``): the trainer's address the engines reach it at,
    #: and the most bytes one broadcast carries.
    transport_host: str = "127.0.0.1"
    bucket_bytes: int = 64 * 2**20
    #: How long the push's group waits for its ranks to join, and for any one broadcast.
    transport_timeout_s: float = 120.0

    @property
    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def engine_version(self, url: str) -> str:
        response = httpx.get(
            f"{url.rstrip('/')}/weight_info", headers=self._headers, timeout=self.timeout_s
        )
        _check(response, url, "/weight_info")
        return str(response.json()["weight_version"])

    def check_engine(self, url: str) -> int:
        """Refuse, before pausing anything, an engine that cannot reload exactly; returns
        how many workers it runs (each one joins a streamed push)."""
        url = url.rstrip("/")
        probe = {"method": "cstack_weight_sync_info"}
        try:
            response = httpx.post(
                f"{url}/collective_rpc", json=probe, headers=self._headers, timeout=self.timeout_s
            )
        except httpx.HTTPError as err:
            raise WeightSyncError(f"{url}: cannot reach the engine: {err}") from err
        if response.status_code == 404:
            _check(response, url, "/collective_rpc")
        info = response.json().get("results", [None]) if response.status_code < 400 else None
        if not info or not isinstance(info[0], dict):
            raise WeightSyncError(
                f"{url}: the engine lacks the weight-sync worker extension; start vLLM with "
                f"--worker-extension-cls {WORKER_EXTENSION} (a plain reload_weights leaves "
                "CPU MoE experts in the wrong layout)"
            )
        if info[0].get("protocol") != PROTOCOL_VERSION:
            raise WeightSyncError(
                f"{url}: weight-sync extension protocol {info[0].get('protocol')}, "
                f"trainer speaks {PROTOCOL_VERSION}; restart the engine from this checkout"
            )
        return len(info)

    def push(self, checkpoint: Path) -> int:
        """Reload ``checkpoint`` into every engine; returns the new policy version."""
        engines = self._engines()
        for url in engines:
            self.check_engine(url)
        with self.gate.exclusive(drain_timeout_s=self.timeout_s) as version:
            new_version = version + 1
            for url in engines:
                held: list[str] = []
                with _left_paused(held), self._paused(url, new_version) as client:
                    held.append(url)
                    rpc = {
                        "method": "cstack_reload_weights",
                        "kwargs": {"weights_path": str(Path(checkpoint).resolve())},
                    }
                    _check(client.post("/collective_rpc", json=rpc), url, "reload")
            self.gate.set_version(new_version)
        return new_version

    def push_weights(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Send ``tensors`` (an HF export's, ``hf_io.hf_tensors``) into every engine without
        writing them to disk (weight_transport.py): one broadcast reaches every worker of
        every engine, all of them paused meanwhile. Returns the new policy version."""
        engines = self._engines()
        self._check_transport_host(engines)
        workers = [self.check_engine(url) for url in engines]
        plan = plan_buckets(tensors, self.bucket_bytes)
        with self.gate.exclusive(drain_timeout_s=self.timeout_s) as version:
            new_version = version + 1
            paused_urls: list[str] = []
            with _left_paused(paused_urls), ExitStack() as paused:
                clients = []
                for url in engines:
                    clients.append(paused.enter_context(self._paused(url, new_version)))
                    paused_urls.append(url)
                if engines:
                    self._stream(engines, clients, workers, tensors, plan)
            self.gate.set_version(new_version)
        return new_version

    def _engines(self) -> list[str]:
        return [replica for url in self.engine_urls for replica in replica_urls(url)]

    def _check_transport_host(self, engines: list[str]) -> None:
        """Refuse, before pausing anything, a loopback address that remote engines would
        take for their own."""
        if not _is_loopback(self.transport_host):
            return
        remote = [url for url in engines if not _is_loopback(urlsplit(url).hostname or "")]
        if remote:
            raise WeightSyncError(
                f"{remote[0]}: a streamed push needs an address of this trainer that the "
                f"engine can reach, not {self.transport_host} (set CSTACK_RL_WEIGHT_SYNC_HOST)"
            )

    @contextmanager
    def _paused(self, url: str, version: int) -> Iterator[httpx.Client]:
        """The engine paused (its running requests finished on the old weights) while the
        caller reloads it through the client; then its cache reset, version set, resumed.

        A reload that fails may have loaded part of the new weights: the engine stays
        paused rather than serve a policy that never existed under the old version's
        name (its cache of the old weights dropped); the next push resumes it."""
        with httpx.Client(base_url=url, headers=self._headers, timeout=self.timeout_s) as client:
            _check(client.post("/pause", params={"mode": "wait"}), url, "/pause")
            try:
                yield client
            except BaseException:
                with contextlib.suppress(httpx.HTTPError):
                    client.post("/reset_prefix_cache")
                raise
            _check(client.post("/reset_prefix_cache"), url, "/reset_prefix_cache")
            update = {"new_version": str(version)}
            _check(
                client.post("/update_weight_version", json=update), url, "/update_weight_version"
            )
            _check(client.post("/resume"), url, "/resume")

    def _stream(
        self,
        urls: list[str],
        clients: list[httpx.Client],
        workers: list[int],
        tensors: Mapping[str, torch.Tensor],
        plan: list[Bucket],
    ) -> None:
        """Rank 0 of the push's group: every engine's workers join it through one
        ``/collective_rpc`` each (answered once they have reloaded), meanwhile the buckets
        go out. A failure names each engine with its answer."""
        listening = listen_socket(self.transport_host)
        port = listening.getsockname()[1]
        token = secrets.token_hex(16)
        world_size = 1 + sum(workers)
        manifest = [[spec.as_json() for spec in bucket] for bucket in plan]
        answers: list[httpx.Response | BaseException | None] = [None] * len(urls)
        # The answer comes once the worker has reloaded: no read timeout on it; the group's
        # own timeout bounds every step of the transfer.
        rpc_timeout = httpx.Timeout(self.timeout_s, read=None)

        def join(index: int) -> None:
            rendezvous = {
                "host": self.transport_host, "port": port, "token": token,
                "world_size": world_size, "first_rank": 1 + sum(workers[:index]),
                "timeout_s": self.transport_timeout_s,
            }  # fmt: skip
            rpc = {
                "method": "cstack_receive_weights",
                "kwargs": {"rendezvous": rendezvous, "buckets": manifest},
            }
            try:
                answers[index] = clients[index].post(
                    "/collective_rpc", json=rpc, timeout=rpc_timeout
                )
            except BaseException as err:  # reported below, with the engine's URL
                answers[index] = err

        threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(len(urls))]
        for thread in threads:
            thread.start()
        group = None
        try:
            group = open_group(
                self.transport_host, port, 0, world_size, token, self.transport_timeout_s,
                listening,
            )  # fmt: skip
            send_buckets(group, tensors, plan)
        except Exception as err:
            group = None  # its store and connections closed, so that workers stop waiting
            for thread in threads:
                thread.join(self.transport_timeout_s)
            raise WeightSyncError(
                f"streamed push failed: {err}; {_answers(urls, answers)}"
            ) from err
        finally:
            group = None
            listening.close()
        for thread in threads:
            thread.join(self.timeout_s)
        for url, answer in zip(urls, answers, strict=True):
            if answer is None:
                raise WeightSyncError(f"{url}: no answer within {self.timeout_s:.0f} s of the push")
            if not isinstance(answer, httpx.Response):
                raise WeightSyncError(f"{url}: streamed reload failed: {answer}")
            _check(answer, url, "streamed reload")


@contextmanager
def _left_paused(urls: list[str]) -> Iterator[None]:
    """A failure once ``urls`` are paused says so: they stay paused (``_paused``)."""
    try:
        yield
    except Exception as err:
        if not urls:
            raise
        raise WeightSyncError(
            f"{err}. Left paused, their weights possibly part new: {', '.join(urls)}; "
            "push again to resume them"
        ) from err


def _answers(urls: list[str], answers: list[httpx.Response | BaseException | None]) -> str:
    """Each engine with what it answered, for an error message."""
    parts = []
    for url, answer in zip(urls, answers, strict=True):
        if isinstance(answer, httpx.Response):
            parts.append(f"{url} answered {answer.status_code}: {answer.text[:200]}")
        else:
            parts.append(f"{url}: {answer or 'no answer'}")
    return "; ".join(parts)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
