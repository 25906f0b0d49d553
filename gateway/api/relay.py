"""Forwarding one admitted request to its tier's pool and relaying the answer back.

A request whose admission is overlapped (``gateway.api.admission``) is written upstream
first, and its admission awaited before its answer: a refusal drops the upstream
connection (vLLM aborts the request) and is the client's answer. The admission runs as a
task of its own, which cancelling the request does not cancel: one that was granted
after its request ended is settled when it is.

Every request admitted by billing is settled exactly once (``Meter.settle``, or
``Meter.settle_nowait`` once its answer is complete), however it ends:
complete, client disconnect (the upstream connection is closed so vLLM aborts the
request), upstream error, or its maximum duration reached. A client disconnect is watched
for while waiting on the upstream, streaming or not, so generation stops as soon as nobody
is listening; the upstream always streams, so the tokens generated until then are billed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from fastapi.responses import Response

from billing.contract import Admission, AdmissionRefused, Meter, Outcome, UsageReport
from gateway.api import json_codec
from gateway.api.admission import refusal_error
from gateway.api.answers import Assembler
from gateway.api.downstream import (
    Client,
    ClientGone,
    JSONAnswer,
    SendEvent,
    SSEResponse,
    client_closed_request,
    until_disconnect,
)
from gateway.api.exchange import (
    MAX_DURATION_CODE,
    OVERHEAD_HEADER,
    Exchange,
    UsageCounts,
    max_duration_exceeded,
    stream_error,
    upstream_error,
    usage_report,
)
from gateway.api.stream import COST_FIELD, EventWriter
from gateway.deadlines import timeout_at
from gateway.errors import GatewayError, upstream_unavailable
from gateway.metrics import GatewayMetrics
from gateway.upstream.engine_slots import EngineBusy
from gateway.upstream.http1 import UpstreamCut, UpstreamReadTimeout
from gateway.upstream.pools import (
    NoUpstreamAvailable,
    Replica,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
)
from serving.vocabulary import ANSWER_SERVICE_TIERS

logger = logging.getLogger(__name__)


class Relay:
    def __init__(self, pools: dict[str, UpstreamPool], meter: Meter, metrics: GatewayMetrics):
        self._pools = pools
        self._meter = meter
        # Label children bound once per tier: ``labels()`` costs a lock and a dict lookup.
        self._inflight = {tier: metrics.inflight.labels(tier) for tier in pools}
        self._tokens_in = {tier: metrics.tokens.labels(tier, "input") for tier in pools}
        self._tokens_out = {tier: metrics.tokens.labels(tier, "output") for tier in pools}
        self._ttft = {tier: metrics.ttft.labels(tier) for tier in pools}
        self._overheads = {tier: metrics.overhead.labels(tier) for tier in pools}
        self._overflows = metrics.tier_overflows

    def max_model_len(self, tier: str) -> int | None:
        """The context length of the tier's engines, once every replica has reported it."""
        return self._pools[tier].max_model_len

    def routes_by_prefix(self, tier: str) -> bool:
        """Whether the tier's pool picks replicas by prompt prefix (a request's key is
        computed only then)."""
        return self._pools[tier].prefixes is not None

    def overflow_to_standard(self, sequences: int, org: str | None = None) -> bool:
        """Whether a fast request of ``sequences``, whose org allows it, goes to the
        standard pool instead (counted if so): every fast engine is full (or down) right
        now and a standard engine has room. Never where the tiers share engines, where
        standard has no room that fast lacks, nor without engine admission, where the
        gateway cannot tell that an engine is full."""
        fast, standard = self._pools["fast"], self._pools["standard"]
        if {r.url for r in fast.replicas} & {r.url for r in standard.replicas}:
            return False
        if fast.has_room(sequences, org) or not standard.has_room(sequences, org):
            return False
        self._overflows.inc()
        return True

    def settle_soon(self, exchange: Exchange, outcome: Outcome, usage: dict[str, Any]) -> None:
        """Settle once the answer is complete, without waiting: the client does not wait
        for billing's write, nor the gateway for a task of its own (the meter sends it with
        the settlements of the moment, and its close sends what is still gathered)."""
        report = self._report_admitted(exchange, outcome, usage)
        if report is None or exchange.admission is None:
            return
        try:
            self._meter.settle_nowait(exchange.admission, report)
        except Exception:
            logger.exception("billing settle failed for request %s", exchange.request_id)

    async def settle(self, exchange: Exchange, outcome: Outcome, usage: dict[str, Any]) -> None:
        """Report usage once and wait until billing has it; billing errors are logged,
        never turned into client errors."""
        report = self._report_admitted(exchange, outcome, usage)
        if report is None or exchange.admission is None:
            return
        try:
            await self._meter.settle(exchange.admission, report)
        except Exception:
            logger.exception("billing settle failed for request %s", exchange.request_id)

    def _report_admitted(
        self, exchange: Exchange, outcome: Outcome, usage: dict[str, Any]
    ) -> UsageReport | None:
        """The report to settle now (``_report``); one whose admission is still on its
        way is handed to it instead (then None)."""
        report = self._report(exchange, outcome, usage)
        if report is not None and exchange.admission is None:
            self._settle_once_admitted(exchange, report)
            return None
        return report

    def _settle_once_admitted(self, exchange: Exchange, report: UsageReport) -> None:
        """Settle an overlapped admission when it arrives, if it was granted (a refused
        one holds nothing): the request ended first, cancelled or failed upstream."""
        admitting = exchange.admitting
        if admitting is None:  # refused: nothing was reserved
            return

        def arrived(task: asyncio.Task[Admission]) -> None:
            if task.cancelled() or task.exception() is not None:
                return
            try:
                self._meter.settle_nowait(task.result(), report)
            except Exception:
                logger.exception("billing settle failed for request %s", report.request_id)

        admitting.add_done_callback(arrived)

    async def _admitted(self, exchange: Exchange) -> None:
        """Wait for the request's overlapped admission, if it is on its way; a refusal
        ends the request with billing's answer. Shielded: a request cancelled meanwhile
        leaves its admission running, to be settled when it arrives."""
        admitting = exchange.admitting
        if admitting is None:
            return
        try:
            # Already back (often, by the time the upstream answers): no shield to build.
            admission = admitting.result() if admitting.done() else await asyncio.shield(admitting)
        except AdmissionRefused as refused:
            exchange.admitting = None
            self._report(exchange, "upstream_error", {})  # counted as ended, billed nothing
            raise refusal_error(refused) from None
        exchange.admission, exchange.admitting = admission, None

    def _report(
        self, exchange: Exchange, outcome: Outcome, usage: dict[str, Any]
    ) -> UsageReport | None:
        """The request's usage report, the first time only (None after)."""
        if exchange.settled:
            return None
        exchange.settled = True
        route = exchange.route
        counts = UsageCounts.of(usage)
        self._inflight[route.tier].dec()
        self._tokens_in[route.tier].inc(counts.prompt)
        self._tokens_out[route.tier].inc(counts.completion)
        if exchange.admission is None and exchange.admitting is None:
            return None  # refused: nothing to bill
        priced = exchange.priced
        if outcome == "complete" and priced is not None and UsageCounts.in_report(priced) == counts:
            return priced  # the report its answer was priced from: billed alike
        return usage_report(exchange, outcome, counts)

    def usage_cost(self, exchange: Exchange, usage: dict[str, Any]) -> dict[str, Any] | None:
        """The request's cost for its answer (``usage.cstack_cost``), priced from the usage
        it will be billed on."""
        exchange.priced = usage_report(exchange, "complete", UsageCounts.of(usage))
        return self._meter.usage_cost(exchange.priced)

    async def open(
        self, exchange: Exchange, path: str, body: bytes, avoid: Replica | None = None
    ) -> UpstreamResponse:
        """Send the request upstream (``avoid``: a replica that failed it, on a retry)."""
        if avoid is None:
            self._inflight[exchange.route.tier].inc()
        headers = {"content-type": "application/json", "x-request-id": exchange.request_id}
        pool = self._pools[exchange.route.tier]
        meanwhile = functools.partial(self._admitted, exchange) if exchange.admitting else None
        opening = time.perf_counter()
        try:
            return await pool.open(
                path,
                body,
                headers,
                avoid,
                exchange.sequences,
                exchange.prefix,
                meanwhile,
                org=exchange.principal.key.org_id,
            )
        except GatewayError:
            raise  # the overlapped admission refused (nothing to settle)
        except EngineBusy as exc:
            await self._admitted(exchange)  # billing's refusal comes first, as without overlap
            await self.settle(exchange, "upstream_error", {})
            raise GatewayError(
                503,
                f"The {exchange.route.tier} tier is at capacity; retry shortly.",
                type="server_error",
                code="engine_overloaded",
                headers={"retry-after": "1"},
            ) from exc
        except NoUpstreamAvailable as exc:
            # The reason names replicas' addresses: for the log, never for the client.
            logger.warning("request %s: no upstream could serve it: %s", exchange.request_id, exc)
            await self._admitted(exchange)
            await self.settle(exchange, "upstream_error", {})
            raise upstream_unavailable(
                "No model server could take the request; retry shortly."
            ) from None
        except UpstreamTimeout as exc:
            logger.warning("request %s: %s", exchange.request_id, exc)
            await self._admitted(exchange)
            await self.settle(exchange, "upstream_error", {})
            raise upstream_unavailable("The model server timed out.", status_code=504) from None
        except BaseException:
            # Cancelled: the client went, or the request reached its maximum duration.
            ended_by_deadline = asyncio.get_running_loop().time() >= exchange.deadline
            await self.settle(
                exchange, "max_duration" if ended_by_deadline else "client_disconnect", {}
            )
            raise
        finally:
            exchange.upstream_s += time.perf_counter() - opening

    async def complete(
        self, exchange: Exchange, client: Client, path: str, body: bytes, assembler: Assembler
    ) -> Response:
        """A non-streaming request: vLLM's stream assembled into one answer."""
        pool = self._pools[exchange.route.tier]

        async def call_upstream() -> None:
            avoid: Replica | None = None
            while True:
                upstream = await self.open(exchange, path, body, avoid)
                try:
                    if upstream.response.status != 200:
                        content = await upstream.response.read()
                        await self.settle(exchange, "upstream_error", {})
                        raise upstream_error(upstream.response.status, content)
                    async for raw in upstream.response:
                        assembler.feed(raw)
                    return
                except (UpstreamCut, UpstreamReadTimeout) as exc:
                    timed_out = isinstance(exc, UpstreamReadTimeout)
                    pool.count_error("timeout" if timed_out else "stream_cut")
                    if not timed_out and avoid is None and len(pool.replicas) > 1:
                        # A replica died mid-answer, but nothing has reached the client:
                        # once more on another replica, as before the response head.
                        avoid = upstream.replica
                        assembler.reset()
                        continue
                    # The client gets no answer, so it pays for none of it.
                    await self.settle(exchange, "upstream_error", {})
                    if timed_out:
                        raise upstream_unavailable("upstream timed out", 504) from None
                    raise upstream_unavailable("upstream failed mid-response", 502) from None
                finally:
                    exchange.upstream_s += upstream.response.waited_s
                    upstream.close()

        try:
            with timeout_at(exchange.deadline):
                await until_disconnect(client, call_upstream())
        except ClientGone:
            await self.settle(exchange, "client_disconnect", assembler.usage)
            return client_closed_request()
        except TimeoutError:
            await self.settle(exchange, "max_duration", assembler.usage)
            raise max_duration_exceeded(exchange) from None
        if assembler.error is not None or not assembler.done:
            if assembler.error is None:
                self._pools[exchange.route.tier].count_error("stream_cut")
            await self.settle(exchange, "upstream_error", {})
            raise stream_error(assembler.error)
        data = assembler.answer()
        data["model"] = exchange.route.public_model
        data["service_tier"] = ANSWER_SERVICE_TIERS[exchange.route.tier]
        answer_usage = data.get("usage")
        if isinstance(answer_usage, dict):  # priced from the chat usage billing settles on
            cost = self.usage_cost(exchange, assembler.usage)
            if cost is not None:
                answer_usage[COST_FIELD] = cost
        content = json_codec.dumps(data)
        response = JSONAnswer(
            content, {**exchange.headers, OVERHEAD_HEADER: self._overhead(exchange)}
        )
        self.settle_soon(exchange, "complete", assembler.usage)
        return response

    async def stream(
        self, exchange: Exchange, client: Client, path: str, body: bytes, rewriter: EventWriter
    ) -> Response:
        try:
            upstream = await until_disconnect(client, self.open(exchange, path, body))
        except ClientGone:
            await self.settle(exchange, "client_disconnect", {})
            return client_closed_request()
        if upstream.response.status != 200:
            try:
                content = await upstream.response.read()
            except (UpstreamCut, UpstreamReadTimeout):
                content = b""
            finally:
                upstream.close()
            await self.settle(exchange, "upstream_error", {})
            raise upstream_error(upstream.response.status, content)
        pump = functools.partial(self._pump, exchange, upstream, rewriter)
        headers = {**exchange.headers, OVERHEAD_HEADER: self._overhead(exchange)}
        return SSEResponse(pump, headers, exchange.deadline, client)

    def _overhead(self, exchange: Exchange) -> str:
        """The gateway's own time so far, observed and as the header's value: a whole
        answer's, or a stream's until its response head (what follows is the engine's pace
        and the client's reading)."""
        seconds = exchange.overhead_s()
        self._overheads[exchange.route.tier].observe(seconds)
        return f"{seconds * 1000:.2f}"

    async def _pump(
        self,
        exchange: Exchange,
        upstream: UpstreamResponse,
        rewriter: EventWriter,
        send_event: SendEvent,
    ) -> None:
        pool = self._pools[exchange.route.tier]
        outcome: Outcome = "upstream_error"
        first = True
        try:
            try:
                with timeout_at(exchange.deadline):
                    async for raw in upstream.response:
                        events = rewriter.feed(raw)
                        if not events:
                            continue
                        if first:
                            first = False
                            elapsed = time.perf_counter() - exchange.started
                            self._ttft[exchange.route.tier].observe(elapsed)
                        # Events that arrived together leave together: one write, not one each.
                        await send_event(b"".join(events))
            except TimeoutError:
                outcome = "max_duration"
                ended = max_duration_exceeded(exchange)
                await send_event(rewriter.error_event(ended.message, MAX_DURATION_CODE))
                return
            except (UpstreamCut, UpstreamReadTimeout) as exc:
                if isinstance(exc, UpstreamReadTimeout):
                    pool.count_error("timeout")
                    message, code = "upstream timed out mid-stream", "upstream_timeout"
                else:
                    pool.count_error("stream_cut")
                    message, code = "upstream failed mid-stream", "upstream_stream_cut"
                await send_event(rewriter.error_event(message, code))
                return
            if rewriter.done and not rewriter.failed:
                outcome = "complete"
            elif not rewriter.failed:
                pool.count_error("stream_cut")
                await send_event(
                    rewriter.error_event("upstream ended the stream early", "upstream_stream_cut")
                )
        except (asyncio.CancelledError, OSError):
            if outcome != "max_duration":
                outcome = "client_disconnect"
            raise
        finally:
            upstream.close()
            self.settle_soon(exchange, outcome, rewriter.usage)
