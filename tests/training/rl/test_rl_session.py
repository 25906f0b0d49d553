"""`cstack rl`'s session attached to running services: workers, trainer and loop start,
one step trains, and the weight push either lands (vLLM in dev mode) or names the fix."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest


@pytest.mark.vllm
def test_session_step_against_running_services(
    redis_url: str, vllm_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    from training.rl.session import RlSession, SessionConfig
    from training.rollouts import WeightSyncError

    config = SessionConfig(
        steps=1, environment="digits", task_ids=(), group_size=2, groups_per_step=1,
        feedback=True, model=tiny_model, workers=1, max_tokens=8, lr=0.02, seed=0,
        out=tmp_path, run_id=uuid.uuid4().hex[:8], task_dir=tmp_path, redis_url=redis_url,
        engine_urls=(vllm_url,),
    )  # fmt: skip
    dev_mode = httpx.get(f"{vllm_url}/is_paused", timeout=30).status_code != 404
    with ExitStack() as stack:
        session = RlSession(config, stack)
        if dev_mode:
            (report,) = list(session.run())
            assert report.policy_version == 1 and report.step == 1
            # leave the shared engine on the original weights
            import redis

            from training.rollouts import PolicyVersionGate, VllmWeightSync

            gate = PolicyVersionGate(redis.Redis.from_url(redis_url), f"restore-{uuid.uuid4()}")
            VllmWeightSync([vllm_url], gate).push(tiny_model)
        else:
            with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
                list(session.run())
    assert (tmp_path / "weights" / "step-000001" / "config.json").is_file()
    assert (tmp_path / "logs" / "rollout-worker-0.log").stat().st_size > 0
