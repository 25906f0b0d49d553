"""Dead letters: an event set aside by the consumer is listed, replayed by the operator
(`cstack billing dead-letters ...`) and then written to the ledger exactly once."""

from __future__ import annotations

import redis
from sqlalchemy import Engine, func, select
from typer.testing import CliRunner

from billing.cli import billing_app
from billing.ledger import UsageRow
from billing.ledger.consumer import UsageStreamConsumer
from billing.settings import BillingSettings
from tests.support.builders import ledger_event


def ledger_rows(engine: Engine) -> int:
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(UsageRow)).scalar_one()


def test_dead_letters_are_listed_and_replayed_once(
    ledger: Engine,
    billing_settings: BillingSettings,
) -> None:
    client = redis.Redis.from_url(billing_settings.redis_url)
    stream, dead = billing_settings.usage_stream, billing_settings.usage_dead_letter_stream
    strict = billing_settings.model_copy(
        update={"ledger_max_deliveries": 0, "ledger_claim_idle_ms": 0}
    )
    consumer = UsageStreamConsumer(client, ledger, strict)
    consumer.ensure_group()
    # A worker reads two good events and dies before acknowledging them; with no
    # redelivery allowed the next drain dead-letters both. A poison entry joins them.
    for name in ("dl-1", "dl-2"):
        client.xadd(stream, {"event": ledger_event(name).model_dump_json()})
    client.xreadgroup(strict.usage_consumer_group, "dead-worker", {stream: ">"}, count=2)
    client.xadd(stream, {"event": b"{not json"})
    result = consumer.drain(max_seconds=10)
    assert (result.inserted, result.dead_lettered) == (0, 3)
    assert ledger_rows(ledger) == 0

    env = {
        "CSTACK_REDIS_URL": billing_settings.redis_url,
        "CSTACK_USAGE_STREAM": stream,
        "CSTACK_USAGE_DEAD_LETTER_STREAM": dead,
    }
    runner = CliRunner()
    listed = runner.invoke(billing_app, ["dead-letters", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["dl-1", "dl-2", "(not"]
    assert "delivered too many times" in lines[0]
    assert "not a usage event" in lines[2]
    ids = [line.split()[0] for line in lines]

    # Nothing moves on a bad id or an ambiguous command line.
    unknown = runner.invoke(billing_app, ["dead-letters", "replay", ids[0], "1-999"], env=env)
    assert unknown.exit_code == 1
    assert unknown.stderr.strip() == "error: no dead letter with id 1-999; nothing was replayed"
    for junk_id in ("yesterday", ids[0].split("-")[0]):  # a bare time part matches several
        junk = runner.invoke(billing_app, ["dead-letters", "replay", junk_id], env=env)
        assert junk.exit_code == 1
        assert junk.stderr.strip() == (
            f"error: {junk_id!r} is not a dead-letter id (like 1796027344594-0); "
            "nothing was replayed"
        )
    both = runner.invoke(billing_app, ["dead-letters", "replay", ids[0], "--all"], env=env)
    assert both.exit_code == 1
    assert both.stderr.strip() == "error: give dead-letter ids or --all (not both)"
    assert client.xlen(dead) == 3

    one = runner.invoke(billing_app, ["dead-letters", "replay", ids[0], ids[0]], env=env)
    assert one.exit_code == 0, one.output
    assert one.stdout.strip() == "replayed 1 dead letter(s) onto the usage stream"
    assert client.xlen(dead) == 2
    lenient = UsageStreamConsumer(client, ledger, billing_settings)
    assert lenient.drain(max_seconds=10).inserted == 1

    # Replaying everything: the second good event lands, the poison one comes back, and a
    # second replay of an event already in the ledger adds nothing.
    client.xadd(dead, {"event": ledger_event("dl-1").model_dump_json(), "reason": b"test"})
    every = runner.invoke(billing_app, ["dead-letters", "replay", "--all"], env=env)
    assert every.stdout.strip() == "replayed 3 dead letter(s) onto the usage stream"
    result = lenient.drain(max_seconds=10)
    assert (result.inserted, result.dead_lettered) == (1, 1)
    assert ledger_rows(ledger) == 2
    remaining = runner.invoke(billing_app, ["dead-letters", "list"], env=env).stdout
    assert len(remaining.splitlines()) == 1 and "not a usage event" in remaining
