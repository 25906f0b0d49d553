"""Fair slots through a real gateway in front of real vLLM: while org B is under its share
of the fast tier, org A, over its own, leaves headroom that B's next requests take at once,
in front of A's waiting request; once B is quiet, A's request gets the slot."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from serving.settings import DEFAULT_VARIANTS_FILE
from tests.support.fakes.replica import Forwarder
from tests.support.gateway import GatewayServer, create_key

pytestmark = pytest.mark.vllm

BODY = {
    "model": "composer-2.5-fast",
    "messages": [{"role": "user", "content": "Count to a thousand."}],
    "max_tokens": 1500,
    "stream": True,
    "ignore_eos": True,
}


@contextlib.contextmanager
def held_stream(client: httpx.Client) -> Iterator[httpx.Response]:
    """A stream whose response head has arrived: it holds its engine slot until closed."""
    with client.stream("POST", "/v1/chat/completions", json=BODY) as response:
        assert response.status_code == 200, response.read()
        yield response


def test_an_org_under_its_share_gets_the_headroom_before_the_busy_orgs_queue(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = yaml.safe_load(DEFAULT_VARIANTS_FILE.read_text())
    assert raw["slot_sharing"]["fair_headroom"] == 2  # the default this test is about
    monkeypatch.setenv("CSTACK_SERVING_PROFILE", "cpu")  # 8 slots on the shared engine
    stalled = forwarders(stall_after=2000)  # streams stay open, holding their slots
    gateway = start_gateway(upstream_url=stalled.url)
    keys = {org: create_key(redis_url, org)[0] for org in ("fair-org-a", "fair-org-b")}

    def client(org: str) -> httpx.Client:
        headers = {"authorization": f"Bearer {keys[org]}"}
        return httpx.Client(base_url=gateway.url, headers=headers, timeout=120)

    with (
        contextlib.ExitStack() as a_streams,
        contextlib.ExitStack() as b_streams,
        client("fair-org-a") as a,
        client("fair-org-b") as b,
    ):
        b_streams.enter_context(held_stream(b))
        # A's share is 4 of 8 with B active; over it, A leaves B the 2 slots B is short of.
        for _ in range(5):
            a_streams.enter_context(held_stream(a))
        answered: dict[str, int] = {}

        def a_sixth() -> None:
            with held_stream(a) as response:
                answered["status"] = response.status_code

        sixth = threading.Thread(target=a_sixth, daemon=True)
        sixth.start()
        sixth.join(timeout=2)  # A's sixth reaches the gateway and waits there
        assert sixth.is_alive() and not answered
        # B's next two requests start in front of A's waiting one: 1 + 5 + 2 = 8 slots.
        for _ in range(2):
            b_streams.enter_context(held_stream(b))
        assert not answered
        # B's streams end: A's sixth gets a slot while A's other five still hold theirs.
        b_streams.close()
        sixth.join(timeout=60)
        assert answered == {"status": 200}
