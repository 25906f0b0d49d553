"""Script calls on one pipelined connection (``billing.redis.batching``, ``billing.redis.resp``),
against a real Valkey: each caller gets its own reply in call order, concurrent calls
share writes (and calls made while a write is unanswered go together once it is
answered), scripts are sent again after Redis forgets them, a connection that cannot be
made or stops answering fails every call waiting on it with redis-py's error, and the
password, db and TLS options of the URL are used."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from billing.redis.batching import Script, ScriptBatcher
from billing.redis.resp import RespConnection, command

#: Appends ARGV[1] to the list KEYS[1] and returns the list's new length.
APPEND = Script("return redis.call('RPUSH', KEYS[1], ARGV[1])")
FAIL = Script("return redis.error_reply('ERR refused ' .. ARGV[1])")


def run(
    redis_url: str,
    scenario: Callable[[ScriptBatcher, Redis], Awaitable[Any]],
    timeout_s: float = 5,
) -> Any:
    async def main() -> Any:
        redis = Redis.from_url(redis_url)
        batcher = ScriptBatcher(RespConnection(redis_url, timeout_s=timeout_s), [APPEND])
        try:
            return await scenario(batcher, redis)
        finally:
            await batcher.aclose()
            await redis.aclose()  # type: ignore[attr-defined]

    return asyncio.run(main())


def test_concurrent_calls_share_writes_and_keep_their_order(redis_url: str) -> None:
    async def scenario(batcher: ScriptBatcher, redis: Redis) -> tuple[Any, ...]:
        await redis.delete("batching:order")
        replies = await asyncio.gather(
            *(batcher.call(APPEND, ["batching:order"], [str(i)]) for i in range(200))
        )
        return replies, await redis.lrange("batching:order", 0, -1), batcher.connection.writes

    replies, stored, writes = run(redis_url, scenario)
    assert replies == list(range(1, 201))  # each caller its own reply
    assert stored == [str(i).encode() for i in range(200)]  # run in the order called
    assert writes < 10  # the first call alone, then the rest together


def test_calls_made_while_redis_has_not_answered_go_together_once_it_has(
    redis_url: str,
) -> None:
    async def scenario(batcher: ScriptBatcher, redis: Redis) -> tuple[Any, ...]:
        await redis.delete("batching:window", "batching:connect")
        await batcher.call(APPEND, ["batching:connect"], ["x"])  # connected
        written = batcher.connection.writes
        await redis.execute_command("CLIENT", "PAUSE", 300)  # unanswered for 300 ms
        first = asyncio.ensure_future(batcher.call(APPEND, ["batching:window"], ["first"]))
        while batcher.connection.writes == written:  # the first call written
            await asyncio.sleep(0)
        written = batcher.connection.writes
        # Made one loop turn after another, all while Redis holds the first.
        later = []
        for i in range(5):
            later.append(asyncio.ensure_future(batcher.call(APPEND, ["batching:window"], [i])))
            await asyncio.sleep(0)
        replies = [await first, *await asyncio.gather(*later)]
        stored = await redis.lrange("batching:window", 0, -1)
        return replies, stored, batcher.connection.writes - written

    replies, stored, writes = run(redis_url, scenario)
    assert replies == [1, 2, 3, 4, 5, 6]
    assert stored == [b"first", b"0", b"1", b"2", b"3", b"4"]
    assert writes == 1  # the five, in one write after the first's reply


def test_a_lone_call_goes_at_once_and_errors_reach_only_their_caller(redis_url: str) -> None:
    async def scenario(batcher: ScriptBatcher, redis: Redis) -> tuple[Any, ...]:
        await redis.delete("batching:alone", "batching:mixed")
        alone = await asyncio.wait_for(batcher.call(APPEND, ["batching:alone"], ["x"]), 5)
        mixed = await asyncio.gather(
            batcher.call(APPEND, ["batching:mixed"], ["a"]),
            batcher.call(FAIL, [], ["b"]),
            batcher.call(APPEND, ["batching:mixed"], ["c"]),
            return_exceptions=True,
        )
        return alone, mixed

    alone, (first, failed, third) = run(redis_url, scenario)
    assert alone == 1
    assert (first, third) == (1, 2)
    assert isinstance(failed, redis_errors.ResponseError) and "refused b" in str(failed)


def test_scripts_are_sent_again_after_redis_forgets_them(redis_url: str) -> None:
    async def scenario(batcher: ScriptBatcher, redis: Redis) -> list[int]:
        await redis.delete("batching:flushed")
        await batcher.call(APPEND, ["batching:flushed"], ["before"])
        await redis.script_flush()
        return list(
            await asyncio.gather(
                *(batcher.call(APPEND, ["batching:flushed"], [str(i)]) for i in range(5))
            )
        )

    assert run(redis_url, scenario) == [2, 3, 4, 5, 6]  # each ran exactly once


def test_an_unreachable_redis_fails_every_call_waiting() -> None:
    async def scenario() -> list[Any]:
        batcher = ScriptBatcher(RespConnection("redis://127.0.0.1:1/0", timeout_s=1))
        return list(
            await asyncio.gather(
                *(batcher.call(APPEND, ["k"], [str(i)]) for i in range(3)),
                return_exceptions=True,
            )
        )

    errors = asyncio.run(scenario())
    assert len(errors) == 3
    assert all(isinstance(e, redis_errors.ConnectionError) for e in errors)
    assert all(str(e).startswith("Error connecting to 127.0.0.1:1") for e in errors)


def test_a_redis_that_stops_answering_times_out_and_the_next_call_reconnects(
    redis_url: str,
) -> None:
    """A server that accepts the connection and never answers the handshake, and a Redis
    that answered and then goes silent mid-call, both give "Timeout reading": Redis is
    there, only slow, and the script may have run (admission then fails closed rather
    than admitting on the outage allowance). The next call connects again."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]

    async def connect_to_silent() -> BaseException:
        connection = RespConnection(f"redis://:pw@127.0.0.1:{port}/0", timeout_s=0.3)
        try:
            await connection.request(command(b"PING"))
        except BaseException as exc:
            return exc
        raise AssertionError("a silent server answered")

    try:
        error = asyncio.run(connect_to_silent())
    finally:
        silent.close()
    assert isinstance(error, redis_errors.TimeoutError)
    assert str(error).startswith("Timeout reading")

    async def scenario(batcher: ScriptBatcher, redis: Redis) -> tuple[Any, ...]:
        connection = batcher.connection
        assert await connection.request(command(b"PING")) == b"PONG"
        await redis.execute_command("CLIENT", "PAUSE", 1000, "ALL")  # answers nobody for 1 s
        try:
            await batcher.call(APPEND, ["batching:paused"], ["x"])
        except redis_errors.TimeoutError as exc:
            stalled = exc
        await asyncio.sleep(1.2)  # Redis answers again
        return stalled, await connection.request(command(b"PING"))

    stalled, again = run(redis_url, scenario, timeout_s=0.3)
    assert str(stalled).startswith("Timeout reading")
    assert again == b"PONG"


def test_a_connection_answering_without_a_pause_outlives_its_timeout(redis_url: str) -> None:
    """The watchdog counts from the last reply, not from the first call: calls kept in
    flight back to back for several times the timeout, each answered at once, never time
    out, and a pause after them still does."""

    async def scenario(batcher: ScriptBatcher, redis: Redis) -> tuple[int, BaseException]:
        connection = batcher.connection
        loop = asyncio.get_running_loop()
        ends = loop.time() + 1.0  # > 3 timeouts, with a reply always awaited

        async def caller() -> int:
            answered = 0
            while loop.time() < ends:
                assert await connection.request(command(b"PING")) == b"PONG"
                answered += 1
            return answered

        answered = sum(await asyncio.gather(*(caller() for _ in range(4))))
        await redis.execute_command("CLIENT", "PAUSE", 1000, "ALL")
        try:
            await connection.request(command(b"PING"))
        except redis_errors.TimeoutError as exc:
            return answered, exc
        raise AssertionError("a paused Redis answered")

    answered, stalled = run(redis_url, scenario, timeout_s=0.3)
    assert answered > 10
    assert str(stalled).startswith("Timeout reading")
    asyncio.run(asyncio.sleep(1.0))  # the pause ends before the next test


def test_the_password_and_db_of_the_url_are_used(redis_url: str) -> None:
    parsed = urlparse(redis_url)

    async def scenario(batcher: ScriptBatcher, redis: Redis) -> tuple[Any, ...]:
        other_db = f"redis://{parsed.netloc}/3"
        own = RespConnection(other_db, timeout_s=5)
        reader = Redis.from_url(other_db)
        try:
            await own.request(command(b"SET", "batching:db", "3"))
            seen_in_3 = await reader.get("batching:db")
        finally:
            await own.aclose()
            await reader.aclose()  # type: ignore[attr-defined]
        wrong = RespConnection(f"redis://:wrong@{parsed.hostname}:{parsed.port}/0", timeout_s=5)
        try:
            await wrong.request(command(b"PING"))
        except redis_errors.ConnectionError as exc:
            refused: BaseException = exc
        return seen_in_3, await redis.get("batching:db"), refused

    seen_in_3, seen_in_default, refused = run(redis_url, scenario)
    assert (seen_in_3, seen_in_default) == (b"3", None)
    if parsed.password:  # the embedded Valkey has one; CI's Redis may not
        assert isinstance(refused, redis_errors.AuthenticationError)


@pytest.mark.parametrize("cancelled", [0, 1])
def test_a_caller_that_gives_up_leaves_the_batch_to_the_others(
    redis_url: str, cancelled: int
) -> None:
    async def scenario(batcher: ScriptBatcher, redis: Redis) -> list[Any]:
        await redis.delete("batching:cancel")
        await batcher.call(APPEND, ["batching:cancel"], ["load"])  # the script is known
        await redis.delete("batching:cancel")
        calls = [
            asyncio.ensure_future(batcher.call(APPEND, ["batching:cancel"], [str(i)]))
            for i in range(3)
        ]
        await asyncio.sleep(0)
        calls[cancelled].cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        await asyncio.sleep(0.1)
        return [*results, await redis.llen("batching:cancel")]

    *results, stored = run(redis_url, scenario)
    assert isinstance(results[cancelled], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i != cancelled] == [
        n for n in (1, 2, 3) if n != cancelled + 1
    ]
    assert stored == 3  # the call given up on still ran: its caller may not know


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost`` and its key (the certificate is its own CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "redis.crt", directory / "redis.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_a_rediss_url_talks_tls_and_checks_the_certificate(redis_url: str, tmp_path: Path) -> None:
    """Through a TLS front (as a managed Redis has) to the real Valkey: the URL's CA is
    trusted, a certificate no CA vouches for is refused, and ``ssl_cert_reqs=none`` skips
    the check, as redis-py does for the same URLs."""
    cert, key = _self_signed(tmp_path)
    backend = urlparse(redis_url)

    async def scenario() -> tuple[Any, ...]:
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(backend.hostname, backend.port)

            async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
                while data := await source.read(65536):
                    sink.write(data)
                sink.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        front = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=server_tls)
        port = front.sockets[0].getsockname()[1]
        credentials = backend.netloc.rpartition("@")[0]
        base = f"rediss://{credentials + '@' if credentials else ''}localhost:{port}/0"
        outcomes: list[Any] = []
        for query in (f"?ssl_ca_certs={cert}", "", "?ssl_cert_reqs=none"):
            connection = RespConnection(base + query, timeout_s=5)
            try:
                outcomes.append(await connection.request(command(b"PING")))
            except redis_errors.ConnectionError as exc:
                outcomes.append(exc)
            await connection.aclose()
        front.close()
        await front.wait_closed()
        return tuple(outcomes)

    trusted, unknown_ca, unchecked = asyncio.run(scenario())
    assert trusted == b"PONG"
    assert isinstance(unknown_ca, redis_errors.ConnectionError)
    assert "certificate verify failed" in str(unknown_ca)
    assert unchecked == b"PONG"


def test_redis_refusing_while_it_loads_is_redis_unreachable() -> None:
    """A Redis still loading its dataset answers every command with LOADING: that is
    redis-py's BusyLoadingError, a ConnectionError, so the meter spools settlements and
    admission uses the outage allowance, as for a Redis that is down."""

    async def loading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            writer.write(b"-LOADING Redis is loading the dataset in memory\r\n")

    async def scenario() -> list[BaseException]:
        server = await asyncio.start_server(loading, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        errors: list[BaseException] = []
        for scripts in ([], [APPEND]):  # fails the call, or the script load on connect
            batcher = ScriptBatcher(
                RespConnection(f"redis://127.0.0.1:{port}/0", timeout_s=5), scripts
            )
            try:
                await batcher.call(APPEND, ["k"], ["v"])
            except redis_errors.RedisError as exc:
                errors.append(exc)
            await batcher.aclose()
        server.close()
        await server.wait_closed()
        return errors

    errors = asyncio.run(scenario())
    assert len(errors) == 2
    assert all(isinstance(e, redis_errors.BusyLoadingError) for e in errors)
    assert all(isinstance(e, redis_errors.ConnectionError) for e in errors)


def test_tls_options_the_connection_cannot_apply_are_refused() -> None:
    with pytest.raises(ValueError, match="ssl_ciphers is not supported"):
        RespConnection("rediss://h:1/0?ssl_ciphers=HIGH", timeout_s=1)
