"""The RL loop end to end on real parts: Celery rollout worker, the session's vLLM, Valkey,
the trainer core on the tiny checkpoint. The engine list of the weight sync is empty here,
so the sync only advances the version and the shared engine keeps its weights;
test_rl_weight_sync.py and test_rl_session.py cover pushes into vLLM itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
import torch


@pytest.mark.vllm
def test_loop_trains_on_fresh_groups_and_advances_the_version(
    process_group: None, redis_url: str, vllm_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    from tokenizers import Tokenizer

    from training.optim.config import MuonConfig
    from training.rl.feedback import load_feedback_config
    from training.rl.learner.config import GRPOConfig
    from training.rl.learner.consumer import TrajectoryConsumer
    from training.rl.learner.loop import LoopConfig, RlLoop
    from training.rl.learner.trainer_hook import grpo_loss_hook
    from training.rl.rollouts.gate import PolicyVersionGate, gate_prefix
    from training.rl.rollouts.weight_sync import VllmWeightSync
    from training.rl.rollouts.worker import TASK_NAME, make_celery
    from training.settings import TrainingSettings
    from training.trainer.config import TrainerConfig
    from training.trainer.loop import Trainer

    run = uuid.uuid4().hex[:8]
    queue, stream = f"rollouts-{run}", f"traj-{run}"
    env = {**os.environ, "CSTACK_REDIS_URL": redis_url, "CSTACK_RL_POLICY_URL": f"{vllm_url}/v1",
           "CSTACK_RL_ROLLOUT_QUEUE": queue, "CSTACK_RL_TRAJECTORY_STREAM": stream,
           "CSTACK_RL_MAX_TOKENS": "16", "OMP_NUM_THREADS": "1"}  # fmt: skip
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "training.rl.rollouts.worker:celery_app", "worker",
         "--concurrency=1", "--pool=prefork", "--without-gossip", "--without-mingle", f"-Q{queue}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        # Groups of 4 replies of 16 tokens: a group whose rewards are all equal (no digit in
        # any reply) has no advantage and so no gradient; with 2 x 8 tokens that happened
        # in all three steps about one run in twelve.
        grpo = GRPOConfig(group_size=4, max_staleness=1, feedback=load_feedback_config())
        trainer = Trainer(
            TrainerConfig(model_path=tiny_model, seed=0, batch_size=1, seq_len=1,
                          optimizer=MuonConfig(lr=0.02, adamw_lr=0.002)),
            loss_fn=grpo_loss_hook(grpo),
        )  # fmt: skip
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        client = redis.Redis.from_url(redis_url)
        gate = PolicyVersionGate(client, gate_prefix(stream))
        consumer = TrajectoryConsumer(client, stream, "trainer", "t0", 2, grpo.max_staleness)
        app = make_celery(TrainingSettings(redis_url=redis_url, rl_rollout_queue=queue))
        tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
        loop = RlLoop(
            trainer, consumer, gate, VllmWeightSync([], gate),
            submit=lambda r: app.send_task(TASK_NAME, args=[r.model_dump()], queue=queue),
            # The disk transport: its exports (and their pruning) are checked below; the
            # session test pushes by stream.
            config=LoopConfig(groups_per_step=1, queued_groups=2, export_dir=tmp_path / "w",
                              weight_transport="disk", grpo=grpo),
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
        )  # fmt: skip
        reports = [loop.run_step(timeout_s=240) for _ in range(3)]
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        log.close()
    assert [r.policy_version for r in reports] == [1, 2, 3] and gate.version() == 3
    assert all(0.0 <= r.mean_reward <= 1.0 and 0 <= r.staleness <= 1 for r in reports)
    assert all(r.tokens_per_s > 0 and r.rollouts_per_s > 0 for r in reports)
    exports = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert exports == ["step-000002", "step-000003"]
    assert (tmp_path / "w" / "step-000003" / "config.json").is_file()
    assert (tmp_path / "w" / "step-000003" / "tokenizer.json").is_file()
    changed = [
        n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])
    ]
    assert changed, "three optimizer steps left every weight untouched"
