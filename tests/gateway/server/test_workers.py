"""`cstack gateway --workers N` (gateway/server/supervisor.py and workers.py): real processes,
billing on.

Which worker served a connection is read from the operating system (the worker process
that owns the server side of the socket), not from anything the gateway tells a client.
The upstream is the fast stand-in of the billing tests (tests/support/fakes/upstream.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import worker_slot_policies
from gateway.upstream.slot_policy import SlotPolicy, share
from serving.process import free_port
from tests.support.billing import REPO
from tests.support.commands import cstack_command
from tests.support.fakes.upstream import SLOW_SEED, UPSTREAM
from tests.support.gateway import create_key, metric_value
from tests.support.waits import wait_until

CHAT = {"model": "composer-2.5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    url: str
    internal_url: str
    port: int
    log: Path

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children()

    def metrics(self) -> str:
        # A new connection each time: any worker may answer.
        return httpx.get(f"{self.internal_url}/metrics", timeout=10).text


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("upstream") / "upstream.log").open("wb")
    process = subprocess.Popen(
        [*UPSTREAM, str(port)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: _ok(f"http://127.0.0.1:{port}/health"), "the upstream stand-in", 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.fixture
def start_gateway(
    upstream: str, redis_url: str, tmp_path: Path
) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def start(*args: str, **settings: str) -> Gateway:
        port, internal = free_port(), free_port()
        suffix = uuid.uuid4().hex[:8]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CSTACK_")},
            "CSTACK_REDIS_URL": redis_url,
            "CSTACK_UPSTREAM_URL": upstream,
            "CSTACK_INTERNAL_PORT": str(internal),
            "CSTACK_HEALTH_INTERVAL_S": "0.5",
            # Billing on, as production runs it, with this test's own stream and files.
            "CSTACK_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
            "CSTACK_USAGE_STREAM": f"cstack:usage:{suffix}",
            "CSTACK_USAGE_DEAD_LETTER_STREAM": f"cstack:usage:dead:{suffix}",
            "CSTACK_USAGE_SPOOL_DIR": str(tmp_path / "spool"),
            **{f"CSTACK_{name.upper()}": value for name, value in settings.items()},
        }
        log = tmp_path / f"gateway-{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                cstack_command("gateway", "--port", str(port), *args),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        gateway = Gateway(
            process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{internal}", port, log
        )
        started.append(gateway)

        def ready() -> bool:
            assert process.poll() is None, f"cstack gateway exited:\n{log.read_text()}"
            # /readyz answers once one worker serves; the supervisor says when all do.
            return _ok(f"{gateway.url}/readyz") and "gateway serving on port" in log.read_text()

        wait_until(ready, "cstack gateway --workers to be ready", 90)
        return gateway

    yield start
    for gateway in started:
        if gateway.process.poll() is None:
            gateway.process.terminate()
            try:
                gateway.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                gateway.process.kill()


def test_requests_spread_over_both_workers_and_metrics_add_up(
    start_gateway: Callable[..., Gateway], redis_url: str
) -> None:
    gateway = start_gateway("--workers", "2")
    workers = gateway.workers()
    assert len(workers) == 2
    key = create_key(redis_url, "workers")[0]
    # Each client one keep-alive connection, all held open while we look at who owns them.
    with connections(gateway.url, key, 16) as clients:
        for client in clients:
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        served = served_by(gateway, workers)
    assert sum(served.values()) == 16, served
    assert all(served.values()), f"a worker served no connection: {served}"

    def counted() -> bool:
        text = gateway.metrics()
        return (
            total(text, "cstack_requests_total", route="chat", status="200") == 16
            and total(text, "cstack_usage_events_total") == 16
        )

    # Every scrape, whichever worker answers it, counts both workers' requests.
    wait_until(counted, "the metrics of both workers", 30)
    for _ in range(6):
        text = gateway.metrics()
        assert total(text, "cstack_requests_total", route="chat", status="200") == 16
        assert metric_value(text, "cstack_upstream_healthy", tier="fast") == 1
        assert metric_value(text, "cstack_upstream_replicas", tier="standard") == 1
        assert metric_value(text, "cstack_inflight_requests", tier="fast") == 0
        labels = {
            name
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            for name in sample.labels
        }
        # Gauges are combined across workers, not listed per process.
        assert "pid" not in labels


def test_sigterm_lets_every_workers_streams_finish_then_stops_them_all(
    start_gateway: Callable[..., Gateway], redis_url: str
) -> None:
    # The stand-in is no engine with a batch size: no admission queue in the way.
    gateway = start_gateway("--workers", "2", shutdown_grace_s="20", engine_admission="false")
    workers = gateway.workers()
    metrics_dir = Path(workers[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
    assert metrics_dir.is_dir()
    key = create_key(redis_url, "workers")[0]
    # Slow streams: 6 tokens a quarter of a second apart, on connections both workers serve.
    slow = {**CHAT, "max_tokens": 6, "stream": True, "seed": SLOW_SEED}
    with connections(gateway.url, key, 8) as clients:
        for client in clients:
            client.get("/v1/models").raise_for_status()  # open the connection
        assert all(served_by(gateway, workers).values())

        def stream(client: httpx.Client, started: Callable[[], None]) -> str:
            with client.stream("POST", "/v1/chat/completions", json=slow) as response:
                lines = response.iter_lines()
                first = next(lines)
                started()
                return "\n".join([first, *lines])

        with ThreadPoolExecutor(len(clients)) as pool:
            begun: list[int] = []
            bodies = [pool.submit(stream, c, lambda: begun.append(1)) for c in clients]
            wait_until(lambda: len(begun) == len(clients), "every stream to start", 30)
            gateway.process.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
            for body in bodies:
                assert body.result(timeout=30).rstrip().endswith("data: [DONE]")
    # The supervisor ends as a single gateway does: terminated by the signal it got.
    assert gateway.process.wait(timeout=30) == -signal.SIGTERM
    assert time.monotonic() - stopped_at < 20
    assert not any(worker.is_running() for worker in workers)
    assert not metrics_dir.exists()
    logged = gateway.log.read_text()
    assert logged.count("Finished server process") == 2, logged


def test_a_worker_that_dies_is_restarted(
    start_gateway: Callable[..., Gateway], redis_url: str
) -> None:
    gateway = start_gateway("--workers", "2")
    first, second = gateway.workers()
    key = create_key(redis_url, "workers")[0]
    first.kill()
    first.wait(timeout=10)

    def replaced() -> bool:
        pids = {worker.pid for worker in gateway.workers()}
        return len(pids) == 2 and second.pid in pids and first.pid not in pids

    wait_until(replaced, "the dead worker's replacement", 60)
    wait_until(
        lambda: "restarted, serving" in gateway.log.read_text(), "the replacement to serve", 60
    )
    with connections(gateway.url, key, 16) as clients:
        for client in clients:
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        served = served_by(gateway, gateway.workers())
    assert all(served.values()), served
    assert gateway.process.poll() is None
    assert "exited with status -9; restarting it" in gateway.log.read_text()


def test_workers_must_be_at_least_one() -> None:
    result = subprocess.run(
        cstack_command("gateway", "--workers", "0"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --workers must be at least 1 (got 0)"


def test_bad_billing_settings_end_the_gateway_in_one_line() -> None:
    env = {**os.environ, "CSTACK_RESERVATION_TTL_S": "1"}
    result = subprocess.run(
        cstack_command("gateway"), capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: invalid setting: Value error, admission_lease_lifetime_ms (1000) must be "
        "shorter than reservation_ttl_s (1 s)"
    )


def test_each_worker_holds_its_share_of_an_engines_slots() -> None:
    assert [share(8, worker, 3) for worker in range(3)] == [3, 3, 2]
    assert [share(2_000_000_000, worker, 2) for worker in range(2)] == [10**9, 10**9]
    policies = {"http://engine": SlotPolicy(size=8, shared=True)}
    sizes = [worker_slot_policies(policies, w, 3)["http://engine"].size for w in range(3)]
    assert sizes == [3, 3, 2]
    # An engine smaller than the worker count still has a slot in every worker.
    tiny = {"http://engine": SlotPolicy(size=1, shared=False)}
    assert [worker_slot_policies(tiny, w, 2)["http://engine"].size for w in range(2)] == [1, 1]
    assert worker_slot_policies(policies, 0, 1) == policies


HEAP_PROBE = """
import gc
from gateway.server.workers import GC_YOUNG_THRESHOLD, prepare_heap_for_serving

def batches(rounds):
    # Requests' objects the way a metered gateway holds them: a batch alive together while
    # the next one is made, then freed together.
    held = None
    for _ in range(rounds):
        held = [{"request": i, "parts": [i, str(i)]} for i in range(500)]  # the last one freed

def cycles(count):
    # Garbage only a collection frees: each list holds itself.
    for _ in range(count):
        loop = []
        loop.append(loop)

def collections(work, *args):
    counted = []
    gc.callbacks.append(lambda phase, info: counted.append(phase) if phase == "start" else None)
    work(*args)
    gc.callbacks.clear()
    return len(counted)

before = collections(batches, 200)
prepare_heap_for_serving()
after = collections(batches, 200)
piled_up = collections(cycles, 5 * GC_YOUNG_THRESHOLD)
threshold_set = gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
print(before, after, piled_up, threshold_set, gc.get_freeze_count() > 0)
"""


def test_a_serving_process_collects_garbage_only_when_it_piles_up() -> None:
    """With CPython's default threshold, every batch of a few hundred requests' objects
    starts a collection of the youngest generation; once the process is ready to serve,
    only garbage that piles up does (what the start allocated is frozen, out of every
    collection)."""
    result = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    before, after, piled_up, threshold_set, frozen = result.stdout.split()
    assert int(before) >= 100  # a collection for about every batch, with the default
    assert (after, threshold_set, frozen) == ("0", "True", "True")
    assert int(piled_up) >= 4  # cycles still collected: once every 10,000 of them


# --- helpers ------------------------------------------------------------------------------


@contextmanager
def connections(url: str, key: str, count: int) -> Iterator[list[httpx.Client]]:
    clients = [
        httpx.Client(
            base_url=url,
            headers={"authorization": f"Bearer {key}"},
            limits=httpx.Limits(max_connections=1),
            timeout=30,
        )
        for _ in range(count)
    ]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def served_by(gateway: Gateway, workers: list[psutil.Process]) -> dict[int, int]:
    """Per worker pid: the established connections on the public port it owns."""
    return {
        worker.pid: sum(
            1
            for conn in worker.net_connections(kind="tcp")
            if conn.laddr and conn.laddr.port == gateway.port and conn.status == "ESTABLISHED"
        )
        for worker in workers
    }


def total(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples that carry ``labels``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_gateway_starts_without_the_trainers_libraries() -> None:
    """Every gateway process runs the `cstack` command, which also carries the trainer's
    commands: torch imported there took 1.3 s of each start and its memory for nothing."""
    probe = (
        "import sys, deploy.cli, gateway.app, gateway.server.workers, billing.worker; "
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
