"""A task's effort and verbosity travel with its rollout requests (through the gateway:
test_agent_gateway.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from training.rl.rollouts.request import RolloutRequest, TaskStyle


def test_the_loop_gives_each_task_its_style() -> None:
    from training.rl.learner.loop import LoopConfig, RlLoop

    submitted: list[RolloutRequest] = []
    config = LoopConfig(
        task_ids=("terse", "plain"), queued_groups=8, sampling_seed=0,
        task_styles={"terse": TaskStyle(reasoning_effort="minimal", verbosity="low")},
    )  # fmt: skip
    loop = RlLoop(
        trainer=SimpleNamespace(),  # type: ignore[arg-type]
        consumer=SimpleNamespace(stats=SimpleNamespace(received=0, dropped_malformed=0)),  # type: ignore[arg-type]
        gate=SimpleNamespace(version=lambda: 0),  # type: ignore[arg-type]
        weights=SimpleNamespace(),  # type: ignore[arg-type]
        submit=submitted.append,
        config=config,
        encode=lambda text: [],
    )
    loop.top_up()
    styles = {(r.task_id, r.reasoning_effort, r.verbosity) for r in submitted}
    assert styles == {("terse", "minimal", "low"), ("plain", None, None)}
    # The request travels as JSON on the Celery queue.
    terse = next(r for r in submitted if r.task_id == "terse")
    again = RolloutRequest.model_validate(json.loads(json.dumps(terse.model_dump())))
    assert again.reasoning_effort == "minimal" and again.verbosity == "low"
