"""The gateway's HTTP/1.1 protocol (gateway/server/http11.py) on a real socket pair and
event loop, made as uvicorn makes it: what leaves in one send, pipelining, hang-ups, bad
requests, bodies read or skipped, 100-continue, HEAD, and headers that would split a
response. (tests/security/test_http.py holds a live gateway to its limits.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.server import ServerState

from gateway.server.hang_up import HANG_UP
from gateway.server.http11 import PIPELINE_LIMIT
from gateway.server.listeners import server_config
from gateway.settings import GatewaySettings

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
ANSWER = [(b"content-type", b"application/json"), (b"content-length", b"2")]


class Sends:
    """The real transport, with each ``write`` it is given recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def connected(
    app: App, tcp: bool = False, **settings: Any
) -> tuple[Any, Sends, socket.socket]:
    """The protocol serving ``app`` on one end of a socket pair (``tcp``: of a loopback TCP
    connection); the client's end."""
    if tcp:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            peer = socket.create_connection(listener.getsockname())
            ours, _ = listener.accept()
    else:
        ours, peer = socket.socketpair()
    ours.setblocking(False)
    loop = asyncio.get_running_loop()
    config = server_config(app, GatewaySettings(**settings), lifespan="off")
    config.load()
    _, protocol = await loop.connect_accepted_socket(
        lambda: config.http_protocol_class(  # type: ignore[misc]
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        ),
        ours,
    )
    sends = Sends(protocol.transport)
    protocol.transport = sends
    return protocol, sends, peer


def read_all(peer: socket.socket) -> bytes:
    peer.settimeout(5)
    received = b""
    while chunk := peer.recv(65536):
        received += chunk
    return received


async def read_some(peer: socket.socket, ending: bytes) -> bytes:
    def read() -> bytes:
        peer.settimeout(5)
        received = b""
        while not received.endswith(ending):
            chunk = peer.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed after {received[-200:]!r}")
            received += chunk
        return received

    return await asyncio.to_thread(read)


def post(body: bytes, *extra: bytes) -> bytes:
    head = b"POST /v1/x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(extra) + b"\r\n" + body


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body; answers it as JSON."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    answer = json.dumps({"path": scope["path"], "body": body.decode()}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def test_an_unstreamed_answer_leaves_in_one_send() -> None:
    protocol, sends, peer = await connected(echo_app)
    peer.sendall(post(b"hi"))
    answer = await read_some(peer, b'"hi"}')
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert len(sends.sent) == 1
    protocol.transport.close()


async def test_a_streams_events_of_one_iteration_leave_together_in_order() -> None:
    later = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for event in (b"a", b"b"):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await later.wait()
        await send({"type": "http.response.body", "body": b"c", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    protocol, sends, peer = await connected(app)
    peer.sendall(post(b""))
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(sends.sent) == 1  # the head and both events, chunked
    assert sends.sent[0].endswith(b"transfer-encoding: chunked\r\n\r\n1\r\na\r\n1\r\nb\r\n")
    later.set()
    assert (await read_some(peer, b"0\r\n\r\n")).endswith(b"1\r\nc\r\n0\r\n\r\n")
    assert len(sends.sent) == 2  # "c" and the end, written in one iteration
    protocol.transport.close()


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    running: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        running.append(scope["path"])
        assert len(running) == 1, "a pipelined request started before the one before it ended"
        await asyncio.sleep(0.01 if scope["path"] == "/first" else 0)
        await echo_app(scope, receive, send)
        running.remove(scope["path"])

    protocol, _, peer = await connected(app)
    first = post(b"1").replace(b"/v1/x", b"/first")
    peer.sendall(first + post(b"2").replace(b"/v1/x", b"/second"))
    answers = await read_some(peer, b'"2"}')
    assert answers.index(b'"/first"') < answers.index(b'"/second"')
    protocol.transport.close()


async def test_a_lost_connection_fires_the_hang_up_of_the_running_and_queued_requests() -> None:
    notices: list[Any] = []
    started = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        notices.append(scope[HANG_UP])
        started.set()
        await asyncio.Event().wait()

    protocol, _, peer = await connected(app)
    peer.sendall(post(b"1") + post(b"2"))
    await started.wait()
    queued = protocol.pipeline[0]
    peer.close()
    for _ in range(50):
        if notices[0].gone:
            break
        await asyncio.sleep(0.01)
    assert notices[0].gone
    assert queued.scope[HANG_UP].gone and queued.disconnected


async def test_a_malformed_request_gets_a_400_in_openais_shape_and_the_connection_closes() -> None:
    _, _, peer = await connected(echo_app)
    peer.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    answer = await asyncio.to_thread(read_all, peer)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_http"


async def test_a_head_too_large_gets_a_431() -> None:
    _, _, peer = await connected(echo_app, max_headers=8)
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(20))
    peer.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n" + many + b"\r\n")
    answer = await asyncio.to_thread(read_all, peer)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"request_header_fields_too_large" in answer


async def test_a_body_left_unread_is_skipped_and_the_next_request_served() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/early":  # answers before reading the body (an auth error)
            await send({"type": "http.response.start", "status": 401, "headers": ANSWER})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        await echo_app(scope, receive, send)

    protocol, _, peer = await connected(app)
    peer.sendall(post(b"x" * 100_000).replace(b"/v1/x", b"/early"))
    peer.sendall(post(b"after"))
    answers = await read_some(peer, b'"after"}')
    assert answers.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert b"HTTP/1.1 200 OK" in answers
    protocol.transport.close()


async def test_chunked_bodies_and_100_continue_are_read() -> None:
    protocol, _, peer = await connected(echo_app)
    peer.sendall(
        b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n"
        b"\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    answer = await read_some(peer, b'"abcde"}')
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    protocol.transport.close()


async def test_head_answers_carry_no_body_and_http_1_0_is_closed_after_its_answer() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": ANSWER})
        await send({"type": "http.response.body", "body": b"{}"})

    _, _, peer = await connected(app)
    peer.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
    answer = await asyncio.to_thread(read_all, peer)  # returns: the connection was closed
    assert answer.endswith(b"content-length: 2\r\nconnection: close\r\n\r\n")


async def test_a_header_that_would_split_the_response_is_refused() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        smuggled = [(b"x-id", b"1\r\nset-cookie: evil=1")]
        await send({"type": "http.response.start", "status": 200, "headers": smuggled})

    _, _, peer = await connected(app)
    peer.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    answer = await asyncio.to_thread(read_all, peer)
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "server_error"
    assert b"evil" not in answer


async def test_a_half_close_sends_what_is_corked_before_the_transport_closes() -> None:
    protocol, _, peer = await connected(echo_app)
    protocol.write(b"the answer")  # corked: waits for the iteration's end
    protocol.eof_received()  # the client's FIN, read in the same iteration
    protocol.transport.close()  # what the real transport then does by itself
    assert await asyncio.to_thread(read_all, peer) == b"the answer"


# Found by a review from outside this suite (each failed before its fix).


async def test_a_head_split_over_two_reads_leaves_no_deadline_to_cut_its_answer() -> None:
    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await asyncio.sleep(0.5)  # longer than the head's deadline
        await echo_app(scope, receive, send)

    protocol, _, peer = await connected(slow, header_timeout_s=0.2)
    request = post(b"hi")
    peer.sendall(request[:10])
    await asyncio.sleep(0.05)
    peer.sendall(request[10:])
    assert (await read_some(peer, b'"hi"}')).startswith(b"HTTP/1.1 200 OK")
    protocol.transport.close()


async def test_a_large_body_answered_unread_over_many_reads_is_skipped() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/early":
            await send({"type": "http.response.start", "status": 401, "headers": ANSWER})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        await echo_app(scope, receive, send)

    protocol, _, peer = await connected(app)
    request = post(b"x" * 300_000).replace(b"/v1/x", b"/early")
    for start in range(0, len(request), 100_000):  # the first read past the high water
        peer.sendall(request[start : start + 100_000])
        await asyncio.sleep(0.01)
    peer.sendall(post(b"after"))
    assert b"HTTP/1.1 200 OK" in await read_some(peer, b'"after"}')
    protocol.transport.close()


async def test_a_header_that_never_ends_gets_a_431() -> None:
    _, _, peer = await connected(echo_app, max_header_bytes=1024)
    peer.sendall(b"GET / HTTP/1.1\r\nhost: t\r\nx-big: ")
    for _ in range(8):
        await asyncio.sleep(0.01)
        with contextlib.suppress(OSError):
            peer.sendall(b"a" * 1000)
    answer = await asyncio.to_thread(read_all, peer)
    assert answer.startswith(b"HTTP/1.1 431 ")


async def test_bytes_after_a_closing_request_do_not_cut_its_answer() -> None:
    _, _, peer = await connected(echo_app)
    peer.sendall(post(b"1", b"connection: close\r\n") + b"GET /b HTTP/1.1\r\n\r\n")
    answer = await asyncio.to_thread(read_all, peer)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b'"1"}')


async def test_a_flood_of_pipelined_requests_is_cut_at_the_limit_and_closed() -> None:
    started = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.set()
        await echo_app(scope, receive, send)

    protocol, _, peer = await connected(app)
    peer.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n" * 5_000)
    await started.wait()
    assert len(protocol.pipeline) <= PIPELINE_LIMIT
    answers = await asyncio.to_thread(read_all, peer)  # returns: the connection closed
    assert answers.count(b"HTTP/1.1 200 OK") == PIPELINE_LIMIT + 1


async def test_trailers_are_no_request_headers_and_upgrades_cut_no_earlier_request() -> None:
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope["path"], [name for name, _ in scope["headers"]]))
        await echo_app(scope, receive, send)

    _, _, peer = await connected(app)
    peer.sendall(
        b"POST /t HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\nauthorization: Bearer smuggled\r\n\r\n"
        b"GET /2 HTTP/1.1\r\nhost: t\r\n\r\n"
        b"GET /3 HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
    )
    answers = await asyncio.to_thread(read_all, peer)
    assert answers.count(b"HTTP/1.1 200 OK") == 3
    assert seen[0] == ("/t", [b"host", b"transfer-encoding"])


async def test_every_waiting_receiver_hears_of_the_hang_up() -> None:
    heard: list[str] = []
    both = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()

        async def listen() -> None:
            heard.append((await receive())["type"])
            if len(heard) == 2:
                both.set()

        await asyncio.gather(listen(), listen())

    _, _, peer = await connected(app)
    peer.sendall(post(b""))
    await asyncio.sleep(0.05)
    peer.close()
    await asyncio.wait_for(both.wait(), 5)
    assert heard == ["http.disconnect", "http.disconnect"]


async def test_an_answer_that_never_asked_for_the_body_closes_the_connection() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 413, "headers": ANSWER})
        await send({"type": "http.response.body", "body": b"{}"})

    _, _, peer = await connected(app)
    peer.sendall(post(b"x" * 10).split(b"\r\n\r\n")[0] + b"\r\nexpect: 100-continue\r\n\r\n")
    answer = await asyncio.to_thread(read_all, peer)  # returns: the connection closed
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer


async def test_a_client_that_reads_nothing_is_cut_off_and_its_request_hangs_up() -> None:
    """A stream to a client that never reads: the app's writes wait on the full buffer
    until ``send_timeout_s`` with nothing taken, then the connection is dropped and the
    request hears of it (as from a hang-up), so it can end and bill what was made."""
    ended = asyncio.Event()
    sent: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while not scope[HANG_UP].gone:
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
            sent.append(1)
            await asyncio.sleep(0)  # as a relay waits on its upstream: the writes leave
        ended.set()

    protocol, _, peer = await connected(app, send_timeout_s=0.2)
    peer.sendall(post(b""))
    await asyncio.wait_for(ended.wait(), 10)  # without the timeout it waits for ever
    assert protocol not in protocol.server_state.connections  # the connection is gone
    assert len(sent) > 1  # it wrote until the buffers were full
    peer.close()


async def test_a_closing_connection_that_cannot_send_its_last_bytes_is_dropped() -> None:
    """An answer larger than every buffer between it and a client that never reads, on a
    connection that closes after it: the close waits at most ``send_timeout_s``."""
    body = b"y" * (8 * 1024 * 1024)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    protocol, _, peer = await connected(app, send_timeout_s=0.2)
    peer.sendall(post(b"", b"connection: close\r\n"))
    for _ in range(500):  # 5 s; it takes about send_timeout_s
        if protocol not in protocol.server_state.connections:
            break
        await asyncio.sleep(0.01)
    assert protocol not in protocol.server_state.connections
    peer.close()


@pytest.mark.parametrize("tcp", [False, True], ids=["socketpair", "tcp"])
async def test_a_slow_reader_is_not_cut_off_while_it_takes_some(tcp: bool) -> None:
    """A client that reads slowly, but reads, gets its whole answer: it takes longer than
    ``send_timeout_s`` in all, but each read resets the timeout. Over TCP too, where the
    transport's buffer alone would not show it (the kernel's queue of megabytes drains
    first): the reads here take 1.5 MiB in under 3 s, slower than that queue's step."""
    body = b"z" * (4 * 1024 * 1024)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for at in range(0, len(body), 65536):
            await send({"type": "http.response.body", "body": body[at : at + 65536],
                        "more_body": at + 65536 < len(body)})  # fmt: skip

    _, _, peer = await connected(app, tcp=tcp, send_timeout_s=1.5)
    peer.sendall(post(b"", b"connection: close\r\n"))

    def read_slowly() -> bytes:
        peer.settimeout(5)
        received = b""
        while chunk := peer.recv(32768):
            received += chunk
            time.sleep(0.05)  # 128 reads at least: over 6 s
        return received

    answer = await asyncio.to_thread(read_slowly)
    assert answer.endswith(body)


async def test_a_half_closed_client_that_reads_nothing_is_cut_off() -> None:
    """A client that sends its request, half-closes and never reads: the transport closes
    itself on the EOF, within ``send_timeout_s`` as any closing connection, and the
    request hears of it."""
    ended = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while not scope[HANG_UP].gone:
            await send({"type": "http.response.body", "body": b"h" * 4096, "more_body": True})
            await asyncio.sleep(0.001)
        ended.set()

    protocol, _, peer = await connected(app, send_timeout_s=0.3)
    peer.sendall(post(b""))
    while not protocol.transport.get_write_buffer_size():  # the buffers between are full
        await asyncio.sleep(0.01)
    peer.shutdown(socket.SHUT_WR)
    await asyncio.wait_for(ended.wait(), 10)  # without the timeout it waits for ever
    assert protocol not in protocol.server_state.connections
    peer.close()
