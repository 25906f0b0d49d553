"""A request's notice that its client hung up, given by the gateway's HTTP protocol.

ASGI tells an app that its client went only through ``receive()``: to notice it while
waiting on something else, an app runs a task that waits on ``receive()``, one task per
request, made and cancelled on the hot path. The gateway's protocol
(``gateway.server.http11``) knows first, in ``connection_lost``: it puts a ``HangUp``
in each request's scope (under ``HANG_UP``) and fires it there, and whoever watches it is
called at once. A server without it (another ASGI server, a test transport) leaves the
scope without one; ``gateway.api.downstream`` then falls back to the task.
"""

from __future__ import annotations

from collections.abc import Callable

#: The scope key of a request's ``HangUp``.
HANG_UP = "cstack.hang_up"


class HangUp:
    """Fired once, when the request's connection is lost before its response completed."""

    __slots__ = ("_callback", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._callback: Callable[[], object] | None = None

    def watch(self, callback: Callable[[], object] | None) -> None:
        """Call ``callback`` when the client hangs up (None: stop watching). One watcher at
        a time: the request's own task, while it waits on something else."""
        self._callback = callback

    def fire(self) -> None:
        if self.gone:
            return
        self.gone = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()
