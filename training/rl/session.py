"""Wire a local RL run: stack, trainer (world of one), consumer, gate, sync, display."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from training.feedback import DEFAULT_FEEDBACK_FILE, load_feedback_config
from training.rl.config import GRPOConfig
from training.rl.loop import LoopConfig, RlLoop, StepReport


@dataclass(frozen=True)
class SessionConfig:
    steps: int
    environment: str
    task_ids: tuple[str, ...]
    group_size: int
    groups_per_step: int
    feedback: bool
    model: Path | None
    workers: int
    max_tokens: int
    lr: float
    seed: int
    out: Path
    run_id: str
    task_dir: Path
    metrics_port: int | None = None
    redis_url: str = ""
    engine_urls: tuple[str, ...] = ()
    policy_url: str = ""
    #: Triggers, hints and the hint-KL coefficient (YAML; see training/feedback.yaml).
    feedback_config: Path = DEFAULT_FEEDBACK_FILE


def _default_tasks(environment: str) -> tuple[str, ...]:
    prefix = "tools" if environment == "toolchoice" else environment
    return tuple(f"{prefix}-{i}" for i in range(4))


def _table(config: SessionConfig, history: list[StepReport], status: str) -> Table:
    table = Table(title=f"cstack rl · {config.environment} · {status}")
    for column in ("step", "version", "reward", "invalid tools", "staleness", "rollouts/s",
                   "tokens/s", "loss", "dropped"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in history[-15:]:
        table.add_row(
            str(r.step), str(r.policy_version), f"{r.mean_reward:.3f}",
            f"{r.invalid_tool_rate:.3f}", f"{r.staleness:.2f}", f"{r.rollouts_per_s:.2f}",
            f"{r.tokens_per_s:.1f}", f"{r.loss:.4f}", str(r.dropped_stale),
        )  # fmt: skip
    return table


class RlSession:
    def __init__(self, config: SessionConfig, stack: ExitStack) -> None:
        self.config = config
        self.stack = stack

    def run(self) -> Iterator[StepReport]:
        import redis
        import torch.distributed as dist
        from tokenizers import Tokenizer

        from serving import build_tiny_checkpoint
        from training.config import TrainerConfig
        from training.optim.config import MuonConfig
        from training.rl.consumer import TrajectoryConsumer
        from training.rl.stack import start_engine, start_valkey, start_workers
        from training.rl.trainer_hook import grpo_loss_hook
        from training.rollouts.gate import PolicyVersionGate, gate_prefix
        from training.rollouts.weight_sync import VllmWeightSync
        from training.rollouts.worker import TASK_NAME, make_celery
        from training.settings import TrainingSettings
        from training.trainer import Trainer

        c = self.config
        logs = c.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        status = ["starting"]
        history: list[StepReport] = []
        # Piped output (logs, CI) gets a width that fits every column, not rich's 80.
        console = Console() if sys.stdout.isatty() else Console(width=110)
        live = self.stack.enter_context(
            Live(_table(c, history, "starting"), console=console, refresh_per_second=2)
        )

        def show(text: str) -> None:
            status[0] = text
            live.update(_table(c, history, text))

        model = c.model or build_tiny_checkpoint(c.out / "model", seed=c.seed)
        if c.redis_url:
            redis_url = c.redis_url
        else:
            show("starting valkey")
            redis_url = start_valkey(self.stack)
        if c.engine_urls:
            engine_urls = list(c.engine_urls)
        else:
            show("starting vLLM (dev mode, about 2 minutes on CPU)")
            engine_urls = [start_engine(self.stack, model, logs, timeout_s=900)]
        policy_url = c.policy_url or f"{engine_urls[0]}/v1"
        queue, stream = f"rollouts-{c.run_id}", f"cstack:rl:{c.run_id}:trajectories"
        settings = TrainingSettings(redis_url=redis_url, rl_rollout_queue=queue,
                                    rl_trajectory_stream=stream)  # fmt: skip
        worker_env = {
            "CSTACK_REDIS_URL": redis_url, "CSTACK_RL_POLICY_URL": policy_url,
            "CSTACK_RL_ROLLOUT_QUEUE": queue, "CSTACK_RL_TRAJECTORY_STREAM": stream,
            "CSTACK_RL_MAX_TOKENS": str(c.max_tokens), "OMP_NUM_THREADS": "1",
            "CSTACK_RL_TASK_DIR": str(c.task_dir),
            "CSTACK_RL_FEEDBACK_CONFIG": str(c.feedback_config),
            **({"CSTACK_RL_METRICS_PORT": str(c.metrics_port + 1)} if c.metrics_port else {}),
        }  # fmt: skip
        show("starting rollout workers")
        start_workers(self.stack, worker_env, c.workers, logs)

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        self.stack.callback(dist.destroy_process_group)
        feedback = load_feedback_config(c.feedback_config)
        grpo = GRPOConfig(group_size=c.group_size,
                          feedback=replace(feedback, enabled=c.feedback))  # fmt: skip
        trainer = Trainer(
            TrainerConfig(model_path=Path(model), seed=c.seed, batch_size=1, seq_len=1,
                          grad_clip=1.0, optimizer=MuonConfig(lr=c.lr, adamw_lr=c.lr / 10),
                          metrics_port=c.metrics_port),
            loss_fn=grpo_loss_hook(grpo),
        )  # fmt: skip
        client = redis.Redis.from_url(redis_url)
        gate = PolicyVersionGate(client, gate_prefix(stream))
        gate.set_version(0)
        consumer = TrajectoryConsumer(client, stream, "trainer", "trainer-0", c.group_size,
                                      grpo.max_staleness)  # fmt: skip
        app = make_celery(settings)
        tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
        pad_id = tokenizer.token_to_id("<|pad|>") or 0
        loop = RlLoop(
            trainer, consumer, gate, VllmWeightSync(engine_urls, gate),
            submit=lambda request: app.send_task(TASK_NAME, args=[request.model_dump()],
                                                 queue=queue),
            config=LoopConfig(
                environment=c.environment,
                task_ids=c.task_ids or _default_tasks(c.environment),
                groups_per_step=c.groups_per_step, queued_groups=2 * c.groups_per_step,
                export_dir=c.out / "weights", grpo=grpo, sampling_seed=c.seed,
            ),
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
            pad_id=pad_id,
        )  # fmt: skip
        for _ in range(c.steps):
            show(f"training step {loop.step + 1}/{c.steps}")
            report = loop.run_step()
            history.append(report)
            show(f"step {report.step}/{c.steps} done")
            yield report
        show("done")
