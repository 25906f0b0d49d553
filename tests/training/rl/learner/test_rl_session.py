"""`cstack rl`'s session on the session's vLLM: rollout worker, trainer, consumer, a weight
push into vLLM after every step (streamed: no export on disk). The policy version advances
step by step and every turn trained on carries the version that produced it. The engine
gets its original weights back at the end (checked with vLLM's weight digests)."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import redis


def _digests(vllm_url: str) -> dict[str, str]:
    response = httpx.post(f"{vllm_url}/weight_checker", json={"action": "checksum"}, timeout=120)
    response.raise_for_status()
    return dict(response.json()["checksums"])


@pytest.mark.vllm
def test_session_steps_push_weights_and_record_turn_versions(
    redis_url: str, vllm_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    from training.rl.learner.config import SessionConfig
    from training.rl.learner.session import RlSession
    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync, WeightSyncError

    if httpx.get(f"{vllm_url}/is_paused", timeout=30).status_code == 404:
        pytest.skip("this vLLM runs without VLLM_SERVER_DEV_MODE=1 (no weight reload endpoints)")
    config = SessionConfig(
        steps=3, environment="digits", task_ids=(), group_size=2, groups_per_step=1,
        feedback=True, model=tiny_model, workers=1, max_tokens=8, lr=0.02, seed=0,
        out=tmp_path, run_id=uuid.uuid4().hex[:8], task_dir=tmp_path, redis_url=redis_url,
        engine_urls=(vllm_url,),
    )  # fmt: skip
    extension = httpx.post(
        f"{vllm_url}/collective_rpc", json={"method": "cstack_weight_sync_info"}, timeout=60
    )
    digests = _digests(vllm_url)
    if extension.status_code != 200:
        with ExitStack() as stack, pytest.raises(WeightSyncError, match="worker-extension-cls"):
            list(RlSession(config, stack).run())
        assert _digests(vllm_url) == digests  # refused before touching the engine
        return

    try:
        with ExitStack() as stack:
            reports = list(RlSession(config, stack).run())
    finally:
        gate = PolicyVersionGate(redis.Redis.from_url(redis_url), f"restore-{uuid.uuid4()}")
        VllmWeightSync([vllm_url], gate).push(tiny_model)
    assert _digests(vllm_url) == digests

    assert [r.step for r in reports] == [1, 2, 3]
    assert [r.policy_version for r in reports] == [1, 2, 3]
    for report in reports:
        # A turn is never from a version the trainer had not pushed when the step began,
        # nor staler than the consumer lets through (max_staleness 2).
        assert report.turn_versions
        assert all(report.step - 3 <= v <= report.step - 1 for v in report.turn_versions)
    # Rollouts sampled after a push record the pushed version, not the one they were
    # queued with.
    assert max(v for r in reports for v in r.turn_versions) >= 1
    # The weights went to vLLM by stream (the default transport): no export on disk.
    assert not (tmp_path / "weights").exists()
    assert (tmp_path / "logs" / "rollout-worker-0.log").stat().st_size > 0
