"""``CorkedTransport`` (gateway/server/http_limits.py) on a real socket pair and event loop:
what one iteration writes leaves in one send, in order, and closing never loses it, nor a
client's half-close (the transport then closes itself, past the corked one)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.server import ServerState

from gateway.server.http_limits import CorkedTransport
from gateway.server.listeners import server_config
from gateway.settings import GatewaySettings


class Sends:
    """The real transport, with each ``write`` it is given recorded: the sends the corked
    transport makes."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def corked_pair() -> tuple[CorkedTransport, Sends, socket.socket]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    sends = Sends(transport)  # type: ignore[arg-type]
    return CorkedTransport(sends, loop), sends, peer  # type: ignore[arg-type]


def read_all(peer: socket.socket) -> bytes:
    peer.settimeout(5)
    received = b""
    while chunk := peer.recv(65536):
        received += chunk
    return received


async def test_one_iterations_writes_leave_in_one_send_in_order() -> None:
    corked, sends, peer = await corked_pair()
    corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    corked.write(b"")  # nothing to send: no send of its own
    corked.write(b"{}")
    assert sends.sent == []  # not before the iteration ends
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sends.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    corked.writelines([b"ne", b"xt"])  # a later iteration: a send of its own, after the first
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sends.sent[1:] == [b"next"]
    corked.close()
    assert await asyncio.to_thread(read_all, peer) == (
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}next"
    )


async def test_close_sends_what_waits_and_abort_drops_it() -> None:
    corked, sends, peer = await corked_pair()
    corked.write(b"an answer, ")
    assert corked.get_write_buffer_size() == len(b"an answer, ")  # waiting counts as buffered
    corked.write_eof()  # the end of what it sends: what waits goes first
    assert sends.sent == [b"an answer, "]
    assert await asyncio.to_thread(read_all, peer) == b"an answer, "
    corked.close()

    corked, sends, peer = await corked_pair()
    corked.write(b"the last answer")
    corked.close()  # in the same iteration: sent before the connection closes
    assert sends.sent == [b"the last answer"]
    assert corked.is_closing()
    assert await asyncio.to_thread(read_all, peer) == b"the last answer"

    corked, sends, peer = await corked_pair()
    corked.write(b"never sent")
    corked.abort()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sends.sent == []
    assert await asyncio.to_thread(read_all, peer) == b""


async def test_writes_after_close_are_dropped() -> None:
    corked, sends, peer = await corked_pair()
    corked.close()
    corked.write(b"too late")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sends.sent == []
    assert await asyncio.to_thread(read_all, peer) == b""
    assert corked.get_extra_info("socket") is not None  # the rest is the real transport's


async def test_a_half_close_sends_what_waits_before_the_transport_closes() -> None:
    """uvicorn's protocol, as the gateway serves with it: when a client half-closes, the
    real transport closes itself after ``eof_received``; an answer written in the same
    iteration was corked, and must leave first."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    loop = asyncio.get_running_loop()
    config = server_config(object(), GatewaySettings())
    config.load()
    transport, protocol = await loop.connect_accepted_socket(
        lambda: config.http_protocol_class(  # type: ignore[misc]
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        ),
        ours,
    )
    protocol.transport.write(b"the answer")  # corked: waits for the iteration's end
    protocol.eof_received()  # the client's FIN, read in the same iteration
    transport.close()  # what the real transport then does by itself
    assert await asyncio.to_thread(read_all, peer) == b"the answer"
