"""`cstack doctor`: what the stack needs, checked before anything starts.

Each check prints one line: ``ok``, ``warn`` (the stack runs without it) or ``FAIL`` with
what to do about it. A failed check is one the stack would otherwise hit minutes later,
deep inside a step: a wrong Python halfway through the install, a taken port in the
gateway's log while vLLM starts, an unreachable Redis in a worker's log.

Only the standard library is imported at the top, and the syntax is Python 3.7's: `make
up` runs this module with the system Python before the venv exists (``python3 -m
deploy.doctor --before-install``), so a machine with the wrong Python or a short disk
hears so before a three-minute install. The checks that read the stack's
settings (ports, Redis, PostgreSQL) import them when they run, after the install.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

#: pyproject.toml's requires-python (``>=3.11,<3.13``); tests/deploy/test_doctor.py
#: keeps the two equal.
PYTHON_MIN = (3, 11)
PYTHON_BELOW = (3, 13)

GIB = 1024**3
#: The venv `make install` creates: vLLM's CPU build and torch, about 4 GiB.
VENV_BYTES = 5 * GIB
#: pip's cache of the wheels it downloads for that venv.
PIP_CACHE_BYTES = 2 * GIB
#: What running the stack writes: the tiny checkpoint, logs, the ledger, vLLM's kernels.
RUN_BYTES = 1 * GIB

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Check:
    """One check's outcome; ``detail`` says what was found and, for a failure, what to do."""

    name: str
    status: str
    detail: str

    @property
    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    shown = ".".join(str(part) for part in version)
    wanted = f"{PYTHON_MIN[0]}.{PYTHON_MIN[1]} or {PYTHON_BELOW[0]}.{PYTHON_BELOW[1] - 1}"
    if PYTHON_MIN <= version[:2] < PYTHON_BELOW:
        return Check("python", OK, f"{shown} ({sys.executable})")
    return Check(
        "python",
        FAIL,
        f"{shown} ({sys.executable}) is not supported: install Python {wanted} and run "
        f"`make up PYTHON=python{PYTHON_MIN[0]}.{PYTHON_MIN[1]}` (delete .venv if it was "
        "made with this one)",
    )


def check_disk(needs: Iterable[tuple[Path, int, str]]) -> Check:
    """``needs``: (where, bytes, what) triples; those on one filesystem add up."""
    by_device: dict[int, tuple[Path, int, list[str]]] = {}
    for path, size, what in needs:
        existing = _existing_ancestor(path)
        device = os.stat(existing).st_dev
        first, total, whats = by_device.get(device, (existing, 0, []))
        by_device[device] = (first, total + size, [*whats, what])
    found: list[str] = []
    short = False
    for where, total, whats in by_device.values():
        free = shutil.disk_usage(where).free
        short = short or free < total
        found.append(
            f"{free / GIB:.1f} GiB free in {where}, {total / GIB:.0f} GiB needed for "
            f"{', '.join(whats)}"
        )
    if short:
        return Check(
            "disk",
            FAIL,
            "; ".join(found) + ": free some space, or put them on another disk (make "
            "VENV=..., PIP_CACHE_DIR, CSTACK_STATE_DIR)",
        )
    return Check("disk", OK, "; ".join(found))


def check_port(host: str, port: int, what: str, variable: str) -> Check:
    """Free if a listener could bind it now. SO_REUSEADDR as uvicorn sets it: connections
    of a stopped run lingering in TIME_WAIT do not make a port taken."""
    name = f"port {port}"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return Check(
                name,
                FAIL,
                f"{host}:{port} ({what}) is taken ({exc.strerror}): stop what listens there "
                f"(`ss -ltnp | grep :{port}`), or set {variable} to a free port",
            )
    return Check(name, OK, f"{host}:{port} free ({what}, {variable})")


def check_redis(url: str) -> Check:
    """Connect, authenticate and PING as the stack would (redis-py, the same URL forms)."""
    import redis

    from billing.contract import RedisUrlError, sync_client
    from serving.redact import redact_url

    shown = redact_url(url)
    try:
        client = sync_client(url, timeout_s=3)
    except RedisUrlError as exc:
        return Check("redis", FAIL, f"CSTACK_REDIS_URL is not a usable Redis URL: {exc}")
    except ValueError:
        return Check("redis", FAIL, "CSTACK_REDIS_URL is not a Redis URL (redis://host:port/db)")
    except redis.RedisError as exc:  # a cluster's client connects as it is made
        return Check("redis", FAIL, f"{shown} does not answer ({_hide(str(exc), url)})")
    try:
        client.ping()
    except redis.AuthenticationError:
        return Check(
            "redis",
            FAIL,
            f"{shown} refused the credentials: fix the user or password in CSTACK_REDIS_URL",
        )
    except redis.RedisError as exc:
        return Check(
            "redis",
            FAIL,
            f"{shown} does not answer ({_hide(str(exc), url)}): start it, fix "
            "CSTACK_REDIS_URL, or unset it to use the embedded Valkey",
        )
    finally:
        client.close()
    return Check("redis", OK, f"{shown} answers (CSTACK_REDIS_URL)")


def check_postgres(url: str) -> Check:
    """``SELECT 1`` through SQLAlchemy with the URL the ledger uses."""
    import sqlalchemy

    from serving.redact import redact_url

    shown = redact_url(url)
    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
    except sqlalchemy.exc.SQLAlchemyError as exc:
        # The driver's own message (its first line), without SQLAlchemy's SQL and links.
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return Check(
            "postgresql",
            FAIL,
            f"{shown} does not answer ({_hide(cause, url)}): start PostgreSQL or fix "
            "CSTACK_LEDGER_URL",
        )
    finally:
        engine.dispose()
    return Check("postgresql", OK, f"{shown} answers (CSTACK_LEDGER_URL)")


def check_prometheus(required: bool) -> Check:
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if not missing:
        return Check("prometheus", OK, "prometheus and promtool on PATH (for the tests)")
    return Check(
        "prometheus",
        FAIL if required else WARN,
        f"{' and '.join(missing)} not on PATH: the observability tests need them; "
        "`make system-deps` installs Debian's prometheus package (as root)",
    )


def install_checks(venv: Path) -> list[Check]:
    """What `make install` needs: nothing but the standard library reads these."""
    return [
        check_python(),
        check_disk(
            [
                (venv, VENV_BYTES, "the venv"),
                (_pip_cache_dir(), PIP_CACHE_BYTES, "pip's cache"),
                (Path(".cstack"), RUN_BYTES, "the stack's state"),
            ]
        ),
    ]


def stack_checks(for_up: bool, for_tests: bool = False) -> list[Check]:
    """What the stack needs, from its settings (CSTACK_* variables).

    ``for_up``: what `cstack up` uses (its own SQLite ledger, so no PostgreSQL check);
    ``for_tests``: prometheus and promtool become required.
    """
    from billing.settings import BillingSettings
    from deploy.settings import DeploySettings

    deploy = DeploySettings()
    checks = [check_python()]
    ports = [(deploy.gateway_port, "gateway", "CSTACK_GATEWAY_PORT")]
    if deploy.gateway_internal_port is not None:
        ports.append((deploy.gateway_internal_port, "gateway internal",
                      "CSTACK_GATEWAY_INTERNAL_PORT"))  # fmt: skip
    if not deploy.vllm_url:
        ports.append((deploy.vllm_port, "vLLM", "CSTACK_VLLM_PORT"))
    checks += [check_port(deploy.host, port, what, var) for port, what, var in ports]
    checks.append(check_disk([(deploy.state_dir, RUN_BYTES, "the stack's state")]))
    if deploy.redis_url_given():
        checks.append(check_redis(deploy.redis_url))
    ledger_url = BillingSettings().ledger_url
    if not for_up and ledger_url.startswith(("postgresql", "postgres:")):
        checks.append(check_postgres(ledger_url))
    checks.append(check_prometheus(required=for_tests))
    return checks


def report(checks: Iterable[Check], echo: Callable[[str], None] = print) -> bool:
    """Print one line per check; True when none failed."""
    passed = True
    for check in checks:
        echo(check.line)
        passed = passed and check.status != FAIL
    return passed


def _hide(text: str, url: str) -> str:
    """``text`` without the URL's password, should a driver's message ever quote it."""
    password = urlsplit(url).password
    if not password:
        return text
    return text.replace(password, "***").replace(unquote(password), "***")


def _existing_ancestor(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists():
        path = path.parent
    return path


def _pip_cache_dir() -> Path:
    configured = os.environ.get("PIP_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.doctor", description=__doc__)
    parser.add_argument(
        "--before-install",
        action="store_true",
        help="only what the install needs (Python, disk); runs with the standard library",
    )
    parser.add_argument("--venv", type=Path, default=Path(".venv"), help="where the venv goes")
    args = parser.parse_args(argv)
    if args.before_install:
        checks = install_checks(args.venv)
    else:
        try:
            checks = stack_checks(for_up=False)
        except ImportError as exc:
            missing = f"error: {exc.name} is not installed for this Python"
            instead = "run .venv/bin/cstack doctor, or pass --before-install"
            print(f"{missing}: {instead}", file=sys.stderr)
            return 2
    return 0 if report(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
