"""Weight sync into a running vLLM: the disk path against the streamed push, per model size.

For each checkpoint (the seed-0 tiny one, and a larger synthetic one of the same
architecture: DeepSeek-V3 with MLA, MoE and an MTP layer, random weights), one vLLM engine
serves it with weight sync (shared variant, CPU profile, eager), and the trainer's state
(the checkpoint read back as the trainer holds it: float32, experts stacked) goes into the
engine both ways, alternating, ``--repeats`` times:

- disk: the RL loop's export (``save_hf_checkpoint``: HF names, safetensors shards) and the
  engine's in-place reload from it (``VllmWeightSync.push``);
- stream: the same tensors built in memory (``hf_tensors``) and broadcast to the engine's
  worker in buckets over a gloo group (``VllmWeightSync.push_weights``,
  training/rl/rollouts/weight_transport.py).

Each push is checked: vLLM's weight digests after a streamed push equal those after the
disk push. Rows give the median seconds of each phase and the bytes per second of the
whole path (the export's tensor bytes over the path's seconds); the ratio is disk over
stream. Both paths end with the same pause, cache reset and resume of the engine.

Here the engine reads the export the trainer just wrote from the page cache, on the same
machine: a disk path with no disk in it. The extra row "disk, cold cache" flushes the
export to disk and drops the page cache before the reload (where /proc/sys/vm/drop_caches
is writable), as an engine on another machine reading a shared volume would start.

    OMP_NUM_THREADS=1 .venv/bin/python bench/weight_sync.py --out .cstack/weight-sync-bench
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import time
import uuid
from pathlib import Path

import httpx
import redis

from serving.engine import engine_for_variant
from serving.process import free_port
from serving.tiny import build_tiny_checkpoint
from serving.valkey import running_valkey
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.hf_io import (
    hf_tensors,
    load_hf_state_dict,
    save_hf_checkpoint,
)
from training.models.deepseek_v3.model import DeepseekV3Model
from training.rl.rollouts.gate import PolicyVersionGate
from training.rl.rollouts.weight_sync import VllmWeightSync

#: Writing 1 drops the page cache (root only; absent or read-only: no cold-cache row).
COLD_CACHE = Path("/proc/sys/vm/drop_caches")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")  # fmt: skip
#: The larger model: about 1.05B parameters (1 dense and 5 MoE layers of 48 experts, and
#: an MTP layer), the tiny checkpoint's vocabulary and attention shapes.
LARGE = {"hidden_size": 1536, "intermediate_size": 4096, "moe_intermediate_size": 768,
         "num_hidden_layers": 6, "n_routed_experts": 48, "num_attention_heads": 8}  # fmt: skip


def large_checkpoint(tiny: Path, out: Path) -> Path:
    """A random checkpoint of the tiny one's architecture with ``LARGE``'s dimensions."""
    if (out / "config.json").is_file():
        return out
    config = dataclasses.replace(ModelConfig.from_pretrained(tiny), **LARGE)
    model = DeepseekV3Model(config)
    model.init_weights(seed=0)
    state = {name: tensor.detach().float() for name, tensor in model.state_dict().items()}
    save_hf_checkpoint(state, config, out)
    for name in TOKENIZER_FILES:
        shutil.copy2(tiny / name, out / name)
    return out


def digests(url: str) -> dict[str, str]:
    reply = httpx.post(f"{url}/weight_checker", json={"action": "checksum"}, timeout=600)
    reply.raise_for_status()
    return dict(reply.json()["checksums"])


def measure(name: str, checkpoint: Path, out: Path, repeats: int, redis_url: str) -> str:
    config = ModelConfig.from_pretrained(checkpoint)
    state = load_hf_state_dict(checkpoint, config)
    params = sum(t.numel() for t in state.values())
    engine = engine_for_variant("shared", checkpoint, free_port(), weight_sync=True,
                                eager=True, log_path=out / f"vllm-{name}.log")  # fmt: skip
    engine.start()
    phases = ("export", "reload", "cold export", "cold reload", "build", "stream")
    timings: dict[str, list[float]] = {phase: [] for phase in phases}
    try:
        engine.wait_healthy(timeout_s=1800)
        gate = PolicyVersionGate(redis.Redis.from_url(redis_url), f"bench-{uuid.uuid4().hex}")
        sync = VllmWeightSync([engine.base_url], gate, timeout_s=1800)
        export = out / f"export-{name}"
        for _ in range(repeats):
            shutil.rmtree(export, ignore_errors=True)
            started = time.perf_counter()
            save_hf_checkpoint(state, config, export)
            exported = time.perf_counter()
            sync.push(export)
            timings["export"].append(exported - started)
            timings["reload"].append(time.perf_counter() - exported)
            on_disk = digests(engine.base_url)
            if COLD_CACHE.exists() and os.access(COLD_CACHE, os.W_OK):
                shutil.rmtree(export)
                started = time.perf_counter()
                save_hf_checkpoint(state, config, export)
                os.sync()  # on disk, as a shared volume would hold it
                exported = time.perf_counter()
                COLD_CACHE.write_text("1\n")
                reloading = time.perf_counter()
                sync.push(export)
                timings["cold export"].append(exported - started)
                timings["cold reload"].append(time.perf_counter() - reloading)

            started = time.perf_counter()
            tensors = hf_tensors(state, config)
            built = time.perf_counter()
            sync.push_weights(tensors)
            timings["build"].append(built - started)
            timings["stream"].append(time.perf_counter() - built)
            assert digests(engine.base_url) == on_disk, "the streamed push loaded other bytes"
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            del tensors
    finally:
        engine.stop()
    median = {key: statistics.median(values) for key, values in timings.items() if values}
    stream = median["build"] + median["stream"]
    rows = []
    for label, export_phase, reload_phase in (
        ("disk (page cache)", "export", "reload"),
        ("disk, cold cache", "cold export", "cold reload"),
    ):
        if export_phase not in median:
            continue
        disk = median[export_phase] + median[reload_phase]
        rows.append(
            f"| {name} | {params / 1e6:,.0f}M | {nbytes / 2**20:,.0f} MiB | {label}: "
            f"{median[export_phase]:.2f} + {median[reload_phase]:.2f} = {disk:.2f} s | "
            f"{median['build']:.2f} + {median['stream']:.2f} = {stream:.2f} s | "
            f"{nbytes / disk / 2**20:,.0f} / {nbytes / stream / 2**20:,.0f} MiB/s | "
            f"{disk / stream:.2f}x |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path(".cstack/weight-sync-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="tiny,large", help="tiny, large or both")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tiny = build_tiny_checkpoint(args.out / "tiny", seed=0)
    checkpoints = {"tiny": tiny}
    if "large" in args.sizes.split(","):
        checkpoints["large"] = large_checkpoint(tiny, args.out / "large")
    rows = []
    with running_valkey() as redis_url:
        for name in args.sizes.split(","):
            rows.append(measure(name, checkpoints[name], args.out, args.repeats, redis_url))
    print(f"medians of {args.repeats} pushes each way, alternating, into one running engine")
    print("| model | parameters | tensor bytes | disk: export + reload | "
          "stream: build + broadcast and reload | disk / stream bytes per s | "
          "disk / stream time |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
