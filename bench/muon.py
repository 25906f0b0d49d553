"""Muon benchmarks: batched vs looped Newton-Schulz, sharded Muon vs gather-everything,
and optimizer step time as the model grows. Prints tables; see bench/RESULTS.md.

    OMP_NUM_THREADS=1 .venv/bin/python bench/muon.py            # all parts
    .venv/bin/python bench/muon.py --part b --worlds 4,8        # one part
    OMP_NUM_THREADS=1 .venv/bin/python bench/muon.py --part calibrate   # `cstack plan`'s
                                                    # figures for this machine (YAML)

Runs unchanged on CUDA: parts (a) and (c) use the GPU when there is one; part (b) uses
NCCL when the machine has at least ``world`` GPUs, else gloo on CPU.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

from serving.process import free_port
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.optim.matrix_layout import MatrixLayout
from training.optim.muon import build_optimizer, matrix_layouts, orthogonalize_full
from training.optim.newton_schulz import flops, orthogonalize
from training.optim.sharded_muon import ShardedOrthogonalizer


def model_config(scale: int) -> ModelConfig:
    """A DeepSeek-V3-shaped model; ``scale`` multiplies width (heads, experts fixed ratios)."""
    return ModelConfig(
        vocab_size=1024, hidden_size=128 * scale, intermediate_size=384 * scale,
        moe_intermediate_size=64 * scale, num_hidden_layers=4, first_k_dense_replace=1,
        num_attention_heads=4 * scale, q_lora_rank=96 * scale, kv_lora_rank=64 * scale,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16,
        num_experts_per_tok=2,
    )  # fmt: skip


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Best of ``repeats`` calls after one warm-up."""
    return timed_interleaved([fn], repeats)[0]


def timed_interleaved(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Best-of-``repeats`` seconds per function. The functions take turns so that a shared
    machine's changing load hits every variant alike, and the minimum is the estimate least
    inflated by other processes' load."""
    samples: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeats):
        for index, fn in enumerate(fns):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            samples[index].append(time.perf_counter() - start)
    return [min(s) for s in samples]


# -- (a) batched per-head / per-expert Newton-Schulz vs a per-matrix loop -------------------


def part_a(scale: int, repeats: int) -> None:
    model = DeepseekV3Model(model_config(scale)).to(device())
    layouts, _ = matrix_layouts(model)
    ns = NewtonSchulzConfig()
    items = [(torch.randn_like(p), layout) for p, layout in layouts.items()]
    matrices = sum(layout.count(tuple(t.shape)) for t, layout in items)

    def batched() -> None:
        orthogonalize_full(items, ns)

    def looped() -> None:
        # torch.optim.Muon style: one Newton-Schulz call per matrix, in a Python loop,
        # slicing each head / expert out of its tensor and writing the result back.
        for tensor, layout in items:
            mats = layout.to_matrices(tensor)
            out = torch.empty_like(mats)
            for index in range(mats.shape[0]):
                out[index] = orthogonalize(mats[index : index + 1], ns)[0]
            layout.from_matrices(out, tuple(tensor.shape))

    whole_2d = [nn.Parameter(torch.randn_like(p)) for p in layouts if p.dim() == 2]
    for p in whole_2d:
        p.grad = torch.randn_like(p)
    torch_muon = torch.optim.Muon(whole_2d, lr=0.02)

    t_batched, t_loop, t_torch = timed_interleaved([batched, looped, torch_muon.step], repeats)
    shapes = {layout.matrix_shape(tuple(t.shape)) for t, layout in items}
    print(f"\n(a) Newton-Schulz over one model (scale {scale}): {matrices} matrices, "
          f"{len(shapes)} shapes, device {device()}")  # fmt: skip
    print(f"{'variant':<44}{'ms/step':>10}{'vs batched':>12}")
    print(f"{'batched per head/expert (ours)':<44}{t_batched * 1e3:>10.1f}{1.0:>12.2f}")
    print(f"{'per-matrix loop, same granularity':<44}{t_loop * 1e3:>10.1f}"
          f"{t_loop / t_batched:>12.2f}")  # fmt: skip
    print(f"{'torch.optim.Muon (2-D tensors whole, no experts)':<44}{t_torch * 1e3:>10.1f}"
          f"{t_torch / t_batched:>12.2f}")  # fmt: skip


# -- (b) sharded Muon: all-to-all (async / sync) vs gather-everything -----------------------


def _gather_everything(params: list[Tensor], layouts: list[MatrixLayout], updates: list[Tensor],
                       ns: NewtonSchulzConfig) -> tuple[list[Tensor], int, int]:  # fmt: skip
    """Baseline: all-gather every full update, orthogonalise all of it on every rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    fulls, sent, work = [], 0, 0
    for param, update in zip(params, updates, strict=True):
        rows = param.shape[0]
        chunk = -(-rows // world)
        padded = update.new_zeros((chunk, *update.shape[1:]))
        padded[: update.shape[0]] = update
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        fulls.append(torch.cat(parts)[:rows])
        sent += (world - 1) * update.numel() * update.element_size()
    results = orthogonalize_full(list(zip(fulls, layouts, strict=True)), ns)
    out = []
    for param, layout, full in zip(params, layouts, results, strict=True):
        m, n = layout.matrix_shape(tuple(param.shape))
        work += layout.count(tuple(param.shape)) * flops(m, n, ns.steps)
        chunk = -(-param.shape[0] // world)
        out.append(full[rank * chunk : (rank + 1) * chunk])
    return out, sent, work


def _b_worker(rank: int, world: int, port: int, scale: int, repeats: int, queue: Any) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    use_nccl = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if use_nccl:
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    address = f"tcp://127.0.0.1:{port}"
    backend = "nccl" if use_nccl else "gloo"
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world)
    dev = "cuda" if use_nccl else "cpu"
    mesh = init_device_mesh(dev, (world,))
    model = DeepseekV3Model(model_config(scale))
    layouts_by_param, _ = matrix_layouts(model)
    gen = torch.Generator().manual_seed(0)
    params: list[Tensor] = [
        distribute_tensor(p.detach().to(dev), mesh, [Shard(0)]) for p in layouts_by_param
    ]
    layouts = list(layouts_by_param.values())
    updates = [torch.randn(p.to_local().shape, generator=gen).to(dev) for p in params]  # type: ignore[attr-defined]
    ns = NewtonSchulzConfig()
    shard_bytes = sum(u.numel() * u.element_size() for u in updates)
    runners = {
        label: ShardedOrthogonalizer(params, layouts, MuonConfig(max_in_flight=in_flight))
        for label, in_flight in (("all-to-all, async (ours)", 2), ("all-to-all, no overlap", 0))
    }
    reference = next(iter(runners.values())).run(updates)
    got, sent, work = _gather_everything(params, layouts, updates, ns)
    diff = max(float((a - b).abs().max()) for a, b in zip(got, reference, strict=True) if a.numel())

    def sharded(runner: ShardedOrthogonalizer) -> Callable[[], None]:
        def run() -> None:
            runner.run(updates)
            dist.barrier()

        return run

    def gather() -> None:
        _gather_everything(params, layouts, updates, ns)
        dist.barrier()

    seconds = timed_interleaved([*(sharded(r) for r in runners.values()), gather], repeats)
    rows = [
        (label, t, r.stats.bytes_sent, r.stats.newton_schulz_flops)
        for (label, r), t in zip(runners.items(), seconds, strict=False)
    ]
    rows.append(("gather everything, NS on every rank", seconds[-1], sent, work))
    queue.put((rank, shard_bytes, rows, diff))
    dist.destroy_process_group()


def part_b(worlds: list[int], scale: int, repeats: int) -> None:
    ctx: Any = mp.get_context("spawn" if torch.cuda.is_available() else "fork")
    for world in worlds:
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=_b_worker, args=(r, world, port, scale, repeats, queue))
                 for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        results = sorted(queue.get() for _ in range(world))
        for p in procs:
            p.join()
        shard = max(r[1] for r in results)
        print(f"\n(b) sharded Muon, world {world}, model scale {scale}: per rank (max over ranks), "
              f"shard {shard / 2**20:.2f} MiB; max |gather - all-to-all| = "
              f"{max(r[3] for r in results):.2e}")  # fmt: skip
        print(f"{'variant':<38}{'ms/step':>9}{'vs ours':>9}{'MiB sent':>10}"
              f"{'vs min':>8}{'NS GFLOP':>10}")  # fmt: skip
        ours = None
        for index, (label, *_rest) in enumerate(results[0][2]):
            seconds = max(r[2][index][1] for r in results)
            sent = max(r[2][index][2] for r in results)
            work = max(r[2][index][3] for r in results)
            ours = ours or seconds
            # Minimum: every shard element leaves once to its owner and comes back once.
            print(f"{label:<38}{seconds * 1e3:>9.1f}{seconds / ours:>9.2f}{sent / 2**20:>10.2f}"
                  f"{sent / (2 * shard):>8.2f}{work / 1e9:>10.2f}")  # fmt: skip


# -- (c) optimizer step time as the model grows ---------------------------------------------


def part_c(scales: list[int], repeats: int) -> None:
    print(f"\n(c) full optimizer step (Muon + AdamW), single process, device {device()}")
    print(f"{'scale':>6}{'params (M)':>12}{'matrices':>10}{'ms/step':>10}{'ns/param':>10}")
    for scale in scales:
        model = DeepseekV3Model(model_config(scale)).to(device())
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer = build_optimizer(model)
        layouts, _ = matrix_layouts(model)
        count = sum(layout.count(tuple(p.shape)) for p, layout in layouts.items())
        numel = sum(p.numel() for p in model.parameters())
        seconds = timed(optimizer.step, repeats)
        print(f"{scale:>6}{numel / 1e6:>12.2f}{count:>10}{seconds * 1e3:>10.1f}"
              f"{seconds / numel * 1e9:>10.1f}")  # fmt: skip


# -- calibration: the throughputs `cstack plan` turns work into time with -------------------


def _all_to_all_worker(rank: int, world: int, port: int, numel: int, repeats: int,
                       queue: Any) -> None:  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    send = torch.randn(numel)
    received = torch.empty_like(send)
    seconds = timed(lambda: dist.all_to_all_single(received, send), repeats)
    # Bytes that leave this rank (its own slice stays) per second.
    queue.put(numel * send.element_size() * (world - 1) / world / seconds)
    dist.destroy_process_group()


def part_calibrate(repeats: int) -> None:
    """Newton-Schulz FLOP/s (fp32, batched, as the optimizer runs it), elementwise memory
    bandwidth, and all-to-all bandwidth between two processes (gloo on CPU)."""
    ns = NewtonSchulzConfig()
    batch = torch.randn(8, 256, 1024, device=device())
    ns_seconds = timed(lambda: orthogonalize(batch, ns), repeats)
    ns_rate = 8 * flops(256, 1024, ns.steps) / ns_seconds
    buf, grad = torch.zeros(1 << 24, device=device()), torch.randn(1 << 24, device=device())
    # lerp_ reads two tensors and writes one: the shape of Muon's and AdamW's updates.
    memory_rate = 3 * buf.numel() * 4 / timed(lambda: buf.lerp_(grad, 0.05), repeats)
    ctx: Any = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_all_to_all_worker, args=(r, 2, port, 1 << 23, repeats, queue))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    link_rate = min(queue.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"# {device()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"newton_schulz_flops: {ns_rate:.3g}  # fp32 [8, 256, 1024], {ns.steps} steps")
    print(f"memory_bandwidth: {memory_rate:.3g}  # lerp_ on 2^24 floats, 12 bytes/element")
    print(f"intra_node_bandwidth: {link_rate:.3g}  # all_to_all_single, 2 ranks, 32 MiB each")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["a", "b", "c", "calibrate", "all"], default="all")
    parser.add_argument("--scale", type=int, default=2, help="model width multiplier, (a)/(b)")
    parser.add_argument("--worlds", default="4,8", help="world sizes for (b)")
    parser.add_argument("--scales", default="1,2,4", help="model scales for (c)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.manual_seed(0)
    if args.part in ("a", "all"):
        part_a(args.scale, args.repeats)
    if args.part in ("b", "all"):
        part_b([int(w) for w in args.worlds.split(",")], args.scale, args.repeats)
    if args.part in ("c", "all"):
        part_c([int(s) for s in args.scales.split(",")], args.repeats)
    if args.part == "calibrate":
        part_calibrate(args.repeats)


if __name__ == "__main__":
    main()
