"""A TCP forwarder run as its own process: an upstream "replica" the tests can kill.

``python tests/support/fakes/forwarder.py LISTEN_PORT TARGET_HOST TARGET_PORT`` relays bytes
both ways; killing it (SIGKILL) drops every connection mid-flight exactly as a crashed
vLLM replica would, while the shared vLLM behind it keeps running.

With ``--overloaded`` it is a replica that is up but cannot serve: it passes its health
check and answers every POST with 503 on a kept-alive connection, as an overloaded vLLM
does, so the gateway's retry of a 5xx on another replica can be tested. With ``--hang``
it is a replica whose engine has stalled: healthy, and it never answers a POST, so every
request sent to it holds its engine slot. With
``--stall-after BYTES`` it stops relaying an event stream after that many bytes and prints
``stalled`` once they have left it: a test that kills it "mid-stream" then knows the
stream cannot have finished already (a fast engine can otherwise generate the whole answer
into socket buffers before the kill). When its client then closes the connection it
prints ``hung up`` (and closes its own connection upstream, which aborts the request in
vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stall_after: int | None = None,
    stalled: asyncio.Event | None = None,
) -> None:
    """Relay bytes; with ``stall_after``, stop relaying an event stream after that many of
    its bytes (the connection stays open, as with a hung upstream) and set ``stalled``."""
    streamed: int | None = None
    try:
        while data := await reader.read(65536):
            if stall_after is not None:
                if streamed is None and b"text/event-stream" in data:
                    streamed = 0
                if streamed is not None:
                    if streamed + len(data) > stall_after:
                        writer.write(data[: max(0, stall_after - streamed)])
                        while writer.transport.get_write_buffer_size():
                            await asyncio.sleep(0.01)
                        print("stalled", flush=True)  # its bytes are in the peer's kernel
                        if stalled is not None:
                            stalled.set()
                        await asyncio.Event().wait()  # until the process is killed
                    streamed += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head (its body read and dropped)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return head


OVERLOADED_BODY = b'{"error":{"message":"engine overloaded","type":"server_error","code":503}}'


async def answer_overloaded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while head := await read_request(reader):
            if head.startswith(b"GET /health"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            else:
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(OVERLOADED_BODY), OVERLOADED_BODY)
                )
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def answer_hung(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while head := await read_request(reader):
            if not head.startswith(b"GET "):
                await asyncio.Event().wait()  # a POST: never answered
            body = b'{"object":"list","data":[]}' if b" /v1/models " in head else b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def main(
    listen_port: int,
    target_host: str,
    target_port: int,
    mode: str,
    stall_after: int | None,
) -> None:
    async def handle(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                target_host, target_port
            )
        except OSError:
            client_writer.close()
            return
        stalled = asyncio.Event()
        to_client = asyncio.create_task(pipe(upstream_reader, client_writer, stall_after, stalled))
        await pipe(client_reader, upstream_writer)  # until the client closes: upstream too
        if stalled.is_set():
            print("hung up", flush=True)  # the client left a stream held here
            to_client.cancel()
        await asyncio.gather(to_client, return_exceptions=True)

    answer = {"overloaded": answer_overloaded, "hang": answer_hung}.get(mode, handle)
    server = await asyncio.start_server(answer, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    options = sys.argv[4:]
    mode = "overloaded" if "--overloaded" in options else "hang" if "--hang" in options else ""
    stall = int(options[options.index("--stall-after") + 1]) if "--stall-after" in options else None
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), mode, stall))
