"""Wire a local RL run: stack, trainer (world of one), consumer, gate, sync, display.

Imported by `cstack rl` only when the command runs (it imports torch).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import redis
import torch.distributed as dist
from tokenizers import Tokenizer

from serving.process import free_port
from serving.tiny import build_tiny_checkpoint
from serving.valkey import running_valkey
from training.optim.config import MuonConfig
from training.rl.feedback import load_feedback_config
from training.rl.learner.config import GRPOConfig, SessionConfig
from training.rl.learner.consumer import TrajectoryConsumer
from training.rl.learner.display import SessionDisplay
from training.rl.learner.loop import LoopConfig, RlLoop, StepReport
from training.rl.learner.stack import start_engine, start_workers
from training.rl.learner.trainer_hook import grpo_loss_hook
from training.rl.rollouts.environments import harder_task
from training.rl.rollouts.gate import PolicyVersionGate, gate_prefix
from training.rl.rollouts.weight_sync import VllmWeightSync
from training.rl.rollouts.worker import TASK_NAME, make_celery
from training.settings import TrainingSettings
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer


@dataclass(frozen=True)
class _Services:
    """Where the session's Redis and engines are, started here or given by the config."""

    redis_url: str
    engine_urls: list[str]
    policy_url: str


class RlSession:
    """Everything it starts is stopped when ``stack`` closes."""

    def __init__(self, config: SessionConfig, stack: ExitStack) -> None:
        self.config = config
        self.stack = stack
        self.logs = config.out_dir / "logs"
        self.queue = f"rollouts-{config.run_id}"
        self.stream = f"cstack:rl:{config.run_id}:trajectories"

    def run(self) -> Iterator[StepReport]:
        """Start what the config does not point at, then yield one report per step."""
        c = self.config
        self.logs.mkdir(parents=True, exist_ok=True)
        display = SessionDisplay(c.environment, c.steps, self.stack, c.heartbeat_s)
        if c.model is None:
            display.show("building the tiny checkpoint")
        model = c.model or build_tiny_checkpoint(c.out_dir / "model", seed=c.seed)
        services = self._start_services(model, display)
        display.show("starting rollout workers")
        self._start_workers(services)
        grpo = self._grpo_config()
        display.show("building the trainer")
        trainer = self._build_trainer(model, grpo)
        loop = self._build_loop(trainer, model, services, grpo)
        yield from self._iterate(loop, display)

    def _start_services(self, model: Path, display: SessionDisplay) -> _Services:
        """Valkey and one vLLM engine (dev mode, weight sync on) unless given URLs."""
        c = self.config
        if c.redis_url:
            redis_url = c.redis_url
        else:
            display.show("starting valkey")
            redis_url = self.stack.enter_context(running_valkey())
        if c.engine_urls:
            engine_urls = list(c.engine_urls)
        else:
            engine_urls = [
                start_engine(self.stack, model, self.logs, timeout_s=900,
                             on_progress=display.show_engine_start)
            ]  # fmt: skip
        policy_url = c.policy_url or f"{engine_urls[0]}/v1"
        return _Services(redis_url, engine_urls, policy_url)

    def _start_workers(self, services: _Services) -> None:
        c = self.config
        env = {
            "CSTACK_REDIS_URL": services.redis_url, "CSTACK_RL_POLICY_URL": services.policy_url,
            "CSTACK_RL_ROLLOUT_QUEUE": self.queue, "CSTACK_RL_TRAJECTORY_STREAM": self.stream,
            "CSTACK_RL_MAX_TOKENS": str(c.max_tokens), "OMP_NUM_THREADS": "1",
            "CSTACK_RL_TASK_DIR": str(c.task_dir),
            "CSTACK_RL_FEEDBACK_CONFIG": str(c.feedback_file),
            **({"CSTACK_RL_METRICS_PORT": str(c.metrics_port + 1)} if c.metrics_port else {}),
        }  # fmt: skip
        start_workers(self.stack, env, c.workers, self.logs)

    def _grpo_config(self) -> GRPOConfig:
        feedback = load_feedback_config(self.config.feedback_file)
        return GRPOConfig(
            group_size=self.config.group_size,
            max_staleness=self.config.max_staleness,
            correction=self.config.correction,
            feedback=replace(feedback, enabled=self.config.feedback),
        )

    def _build_trainer(self, model: Path, grpo: GRPOConfig) -> Trainer:
        """The trainer in a single-rank gloo process group, with the GRPO loss."""
        c = self.config
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
        self.stack.callback(dist.destroy_process_group)
        return Trainer(
            TrainerConfig(model_path=Path(model), seed=c.seed, batch_size=1, seq_len=1,
                          grad_clip=1.0, optimizer=MuonConfig(lr=c.lr, adamw_lr=c.lr / 10),
                          mtp_loss_weight=c.mtp_loss_weight, metrics_port=c.metrics_port),
            loss_fn=grpo_loss_hook(grpo),
        )  # fmt: skip

    def _build_loop(
        self, trainer: Trainer, model: Path, services: _Services, grpo: GRPOConfig
    ) -> RlLoop:
        """The loop: rollouts submitted to the workers' queue, trajectories consumed from
        the stream, weights pushed into the engines, the policy version gated."""
        c = self.config
        client = redis.Redis.from_url(services.redis_url)
        gate = PolicyVersionGate(client, gate_prefix(self.stream))
        gate.set_version(0)
        consumer = TrajectoryConsumer(client, self.stream, "trainer", "trainer-0", c.group_size,
                                      grpo.max_staleness)  # fmt: skip
        app = make_celery(TrainingSettings(redis_url=services.redis_url,
                                           rl_rollout_queue=self.queue,
                                           rl_trajectory_stream=self.stream))  # fmt: skip
        tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
        return RlLoop(
            trainer, consumer, gate,
            VllmWeightSync(services.engine_urls, gate,
                           transport_host=TrainingSettings().rl_weight_sync_host),
            submit=lambda request: app.send_task(TASK_NAME, args=[request.model_dump()],
                                                 queue=self.queue),
            config=LoopConfig(
                environment=c.environment,
                task_ids=c.rollout_task_ids, task_styles=c.styles,
                groups_per_step=c.groups_per_step,
                # Synchronous: nothing sampled ahead that the next push would make stale.
                queued_groups=(2 if c.max_staleness else 1) * c.groups_per_step,
                export_dir=c.out_dir / "weights", weight_transport=c.weight_transport,
                grpo=grpo, sampling_seed=c.seed, curriculum=c.curriculum,
            ),
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
            pad_id=tokenizer.token_to_id("<|pad|>") or 0,
            harder=functools.partial(harder_task, c.environment, c.task_dir),
        )  # fmt: skip

    def _iterate(self, loop: RlLoop, display: SessionDisplay) -> Iterator[StepReport]:
        steps = self.config.steps
        for _ in range(steps):
            display.step_started(loop.step + 1, lambda: loop.consumer.stats.received)
            report = loop.run_step()
            display.step_done(report)
            yield report
        display.show("done")
