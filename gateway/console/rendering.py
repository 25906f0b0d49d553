"""How console pages are rendered and what they load: the Jinja2 templates (autoescaped),
money and time formats, the headers every page carries, and the static files (the
console's own script and style, and plotly.js from plotly's installed wheel).
"""

from __future__ import annotations

import importlib.util
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response

HERE = Path(__file__).parent
STATIC = HERE / "static"
#: What a page may load: only the gateway's own files (plotly.js sets inline styles).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
PAGE_HEADERS = {
    "cache-control": "no-store",
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}
NANO_PER_USD = 1_000_000_000


def plotly_js() -> Path:
    """plotly.min.js as the installed plotly wheel ships it (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("plotly is not installed: the console's charts need its plotly.min.js")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"


def dollars(nano: int | None) -> str:
    """Exact dollars from nano-USD, as the API writes them (``$0.000003000``)."""
    if nano is None:
        return ""
    sign = "-" if nano < 0 else ""
    whole, frac = divmod(abs(nano), NANO_PER_USD)
    return f"{sign}${whole}.{frac:09d}"


def cents(amount: int) -> str:
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), 100)
    return f"{sign}${whole:,}.{frac:02d}"


def when(value: float | str | None) -> str:
    """A Unix time or an ISO instant as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if value is None or value == "":
        return ""
    if isinstance(value, int | float):
        moment = datetime.fromtimestamp(value, UTC)
    else:
        moment = datetime.fromisoformat(value)
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def this_month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


def recent_months(count: int = 12) -> list[str]:
    """This month and the ``count - 1`` before it, newest first."""
    today = datetime.now(UTC).date()
    year, month = today.year, today.month
    months = []
    for _ in range(count):
        months.append(f"{year:04d}-{month:02d}")
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)
    return months


def month_days(period: str) -> tuple[date, date]:
    """First and last day of ``YYYY-MM``; ValueError for anything else."""
    first = datetime.strptime(period, "%Y-%m").date()
    following = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    return first, date.fromordinal(following.toordinal() - 1)


class Pages:
    """The templates of the console, rendered with the headers every page carries."""

    def __init__(self) -> None:
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(["jinja", "html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(dollars=dollars, cents=cents, when=when)

    def render(self, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
        html = self.env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status_code, headers=PAGE_HEADERS)


def add_static_routes(app: Starlette, prefix: str) -> None:
    """``{prefix}/static/``: plotly.min.js from the wheel, the console's script and style."""
    files = {
        "plotly.min.js": plotly_js(),
        "console.js": STATIC / "console.js",
        "console.css": STATIC / "console.css",
    }
    for path in files.values():
        if not path.is_file():
            raise RuntimeError(f"the console's {path.name} is missing at {path}")

    async def static(request: Request) -> Response:
        path = files.get(request.path_params["name"])
        if path is None:
            return Response("not found", status_code=404, media_type="text/plain")
        return FileResponse(
            path,
            headers={"cache-control": "public, max-age=3600", "x-content-type-options": "nosniff"},
        )

    app.add_route(f"{prefix}/static/{{name}}", static, methods=["GET", "HEAD"])
