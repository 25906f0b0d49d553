"""Fair slots through a real gateway in front of real vLLM: while org B is under its share
of the fast tier, org A, over its own, leaves headroom that B's next requests take at once,
in front of A's waiting request; once B is quiet, A's request gets the slot."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import httpx
import pytest
import yaml

from serving.settings import DEFAULT_VARIANTS_FILE
from tests.support.gateway import GatewayServer, create_key, held_stream

pytestmark = pytest.mark.vllm


def test_an_org_under_its_share_gets_the_headroom_before_the_busy_orgs_queue(
    stalled_gateway: Callable[..., GatewayServer], redis_url: str
) -> None:
    raw = yaml.safe_load(DEFAULT_VARIANTS_FILE.read_text())
    assert raw["slot_sharing"]["fair_headroom"] == 2  # the default this test is about
    gateway = stalled_gateway()  # 8 slots on the shared engine; streams hold theirs
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
