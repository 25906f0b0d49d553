"""Muon benchmarks: Newton-Schulz by precision and method, batched vs per-matrix, sharded
Muon's owners (job-wide vs shard group, overlap, gather-everything) and the optimizer step
as the model grows; and `cstack plan`'s calibration. Prints tables; see bench/RESULTS.md.

    OMP_NUM_THREADS=1 .venv/bin/python bench/muon.py             # parts ns, a, b, c
    .venv/bin/python bench/muon.py --part b --worlds 4,8         # one part
    .venv/bin/python bench/muon.py --part calibrate --device-name h200   # on a GPU machine:
        # measures cstack plan's figures and writes them into training/plan/calibration.yaml

Runs unchanged on CUDA: parts ns, a and c use the GPU when there is one; part b uses NCCL
when the machine has at least ``world`` GPUs, else gloo on CPU (bench/muon_calibration.py
says what calibrate measures).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from muon_calibration import _best_seconds, _device, _init, calibrate
from torch import Tensor

from serving.process import free_port
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.optim.muon import Muon, build_optimizer, matrix_layouts, orthogonalize_full
from training.optim.muon_reference import newton_schulz_reference
from training.optim.newton_schulz import flops, orthogonalize, uses_gram


def model_config(scale: int) -> ModelConfig:
    """A DeepSeek-V3-shaped model; ``scale`` multiplies width (heads, experts fixed ratios)."""
    return ModelConfig(
        vocab_size=1024, hidden_size=128 * scale, intermediate_size=384 * scale,
        moe_intermediate_size=64 * scale, num_hidden_layers=4, first_k_dense_replace=1,
        num_attention_heads=4 * scale, q_lora_rank=96 * scale, kv_lora_rank=64 * scale,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16,
        num_experts_per_tok=2,
    )  # fmt: skip


def timed(fns: list[Any], repeats: int) -> list[float]:
    """Best-of-``repeats`` seconds per function, the functions taking turns so that a shared
    machine's changing load hits every variant alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for index, fn in enumerate(fns):
            best[index] = min(best[index], _best_seconds(fn, 1))
    return best


# -- (ns) Newton-Schulz by precision and method, per shape ----------------------------------


def part_ns(shapes: list[tuple[int, int]], batch: int, repeats: int) -> None:
    print(f"\n(ns) orthogonalize() on [{batch}, m, n], device {_device()}; error: relative "
          f"Frobenius distance from the float64 reference")  # fmt: skip
    print(f"{'shape':<14}{'variant':<20}{'ms':>9}{'vs fp32 std':>13}{'GFLOP':>9}{'error':>9}")
    variants = [(d, m) for d in ("float32", "bfloat16", "float16") for m in ("standard", "gram")]
    for rows, cols in shapes:
        gen = torch.Generator().manual_seed(0)
        low_rank = torch.randn(batch, rows, 16, generator=gen) @ torch.randn(
            batch, 16, cols, generator=gen
        )
        x = (low_rank + 0.05 * torch.randn(batch, rows, cols, generator=gen)).to(_device())
        configs = [NewtonSchulzConfig(dtype=d, method=m) for d, m in variants]  # type: ignore[arg-type]
        seconds = timed([lambda c=c, x=x: orthogonalize(x, c) for c in configs], repeats)
        expected = torch.stack([newton_schulz_reference(m.cpu(), NewtonSchulzConfig()) for m in x])
        for (dtype, method), config, t in zip(variants, configs, seconds, strict=True):
            got = orthogonalize(x, config).float().cpu()
            error = ((got - expected).norm() / expected.norm()).item()
            label = f"{dtype} {method}" + ("" if uses_gram(rows, cols, config) or
                                           method == "standard" else " (std)")  # fmt: skip
            print(f"{f'[{rows}, {cols}]':<14}{label:<20}{t * 1e3:>9.1f}{seconds[0] / t:>13.2f}"
                  f"{batch * flops(rows, cols, config) / 1e9:>9.2f}{error:>9.4f}")  # fmt: skip


# -- (a) batched per-head / per-expert Newton-Schulz vs a per-matrix loop -------------------


def part_a(scale: int, repeats: int) -> None:
    model = DeepseekV3Model(model_config(scale)).to(_device())
    layouts, _ = matrix_layouts(model)
    ns = NewtonSchulzConfig(dtype="float32", method="standard")
    items = [(torch.randn_like(p), layout) for p, layout in layouts.items()]
    matrices = sum(layout.count(tuple(t.shape)) for t, layout in items)

    def looped() -> None:
        # torch.optim.Muon style: one Newton-Schulz call per matrix, in a Python loop.
        for tensor, layout in items:
            mats = layout.to_matrices(tensor)
            torch.cat([orthogonalize(mats[i : i + 1], ns) for i in range(mats.shape[0])])

    whole_2d = [torch.nn.Parameter(torch.randn_like(p)) for p in layouts if p.dim() == 2]
    for p in whole_2d:
        p.grad = torch.randn_like(p)
    torch_muon = torch.optim.Muon(whole_2d, lr=0.02)
    t_batched, t_loop, t_torch = timed(
        [lambda: orthogonalize_full(items, ns), looped, torch_muon.step], repeats
    )
    print(f"\n(a) Newton-Schulz (float32 standard) over one model (scale {scale}): {matrices} "
          f"matrices, device {_device()}")  # fmt: skip
    print(f"{'variant':<48}{'ms/step':>10}{'vs batched':>12}")
    for label, t in (("batched per head/expert (ours)", t_batched),
                     ("per-matrix loop, same granularity", t_loop),
                     ("torch.optim.Muon (2-D tensors whole, no experts)", t_torch)):  # fmt: skip
        print(f"{label:<48}{t * 1e3:>10.1f}{t / t_batched:>12.2f}")


# -- (b) sharded Muon on the dual mesh: owners, overlap, gather-everything ------------------

VARIANTS = {
    "job-wide owners, async (default)": MuonConfig(),
    "shard-group owners, async (before)": MuonConfig(owners="shard_group"),
    "job-wide owners, no overlap": MuonConfig(max_in_flight=0),
}


def _b_worker(rank: int, world: int, port: int, queue: Any, scale: int, dense_group: int,
              repeats: int) -> None:  # fmt: skip
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from training.optim.sharded_muon import ShardedOrthogonalizer

    device = _init(rank, world, port)
    dense = init_device_mesh(device, (world // dense_group, dense_group))
    experts = init_device_mesh(device, (1, world))
    place = [Replicate(), Shard(0)]
    model = DeepseekV3Model(model_config(scale))
    by_param, _ = matrix_layouts(model)
    names = {id(p): n for n, p in model.named_parameters()}
    meshes = [experts if ".experts." in names[id(p)] else dense for p in by_param]
    params = [distribute_tensor(p.detach().to(device), mesh, place)
              for p, mesh in zip(by_param, meshes, strict=True)]  # fmt: skip
    layouts = list(by_param.values())
    gen = torch.Generator().manual_seed(rank)
    updates = [torch.randn(p.to_local().shape, generator=gen).to(device) for p in params]
    runners = {label: ShardedOrthogonalizer(params, layouts, config)
               for label, config in VARIANTS.items()}  # fmt: skip
    ns = MuonConfig().newton_schulz

    def gather_everything() -> list[Tensor]:
        fulls = [DTensor.from_local(u, p.device_mesh, place, shape=p.shape, stride=p.stride())
                 .full_tensor() for u, p in zip(updates, params, strict=True)]  # fmt: skip
        return orthogonalize_full(list(zip(fulls, layouts, strict=True)), ns)

    def step(fn: Any) -> Any:
        return lambda: (fn(), dist.barrier())

    fns = [step(lambda r=r: r.run(updates)) for r in runners.values()]
    seconds = timed([*fns, step(gather_everything)], repeats)
    # Gather-everything: every rank receives every other rank's shards and runs all of it.
    total = sum(layout.count(tuple(p.shape)) * flops(*layout.matrix_shape(tuple(p.shape)), ns)
                for p, layout in zip(params, layouts, strict=True))  # fmt: skip
    shard = sum(u.numel() * 4 for u in updates)
    rows = [(label, t, r.stats.bytes_sent, r.stats.newton_schulz_flops)
            for (label, r), t in zip(runners.items(), seconds, strict=False)]  # fmt: skip
    # All-gather in each shard group: this rank's shard goes to every other member.
    gathered = sum(u.numel() * 4 * (p.device_mesh.size(1) - 1)
                   for u, p in zip(updates, params, strict=True))  # fmt: skip
    rows.append(("gather everything, NS on every rank", seconds[-1], gathered, total))
    queue.put((rank, shard, rows))
    dist.destroy_process_group()


def part_b(worlds: list[int], scale: int, dense_group: int, repeats: int) -> None:
    for world in worlds:
        ctx: Any = mp.get_context("spawn" if torch.cuda.is_available() else "fork")
        queue, port = ctx.Queue(), free_port()
        procs = [ctx.Process(target=_b_worker, args=(r, world, port, queue, scale, dense_group,
                                                     repeats)) for r in range(world)]  # fmt: skip
        for p in procs:
            p.start()
        results = sorted(queue.get() for _ in range(world))
        for p in procs:
            p.join()
        print(f"\n(b) sharded Muon orthogonalisation, world {world}, dense group {dense_group}, "
              f"EP {world}, model scale {scale}, Newton-Schulz {MuonConfig().newton_schulz.dtype}"
              f" Gram; shard {max(r[1] for r in results) / 2**20:.2f} MiB/rank")  # fmt: skip
        print(f"{'variant':<40}{'ms':>8}{'vs ours':>9}{'MiB sent':>10}{'NS GFLOP max':>14}"
              f"{'mean':>8}")  # fmt: skip
        ours = max(r[2][0][1] for r in results)
        for index, (label, *_rest) in enumerate(results[0][2]):
            seconds = max(r[2][index][1] for r in results)
            sent = max(r[2][index][2] for r in results)
            work = [r[2][index][3] for r in results]
            print(f"{label:<40}{seconds * 1e3:>8.1f}{seconds / ours:>9.2f}{sent / 2**20:>10.2f}"
                  f"{max(work) / 1e9:>14.2f}{sum(work) / world / 1e9:>8.2f}")  # fmt: skip


# -- (c) optimizer step time as the model grows ---------------------------------------------


def part_c(scales: list[int], repeats: int) -> None:
    print(f"\n(c) full optimizer step (Muon + AdamW), single process, device {_device()}")
    print(f"{'scale':>6}{'params (M)':>12}{'matrices':>10}{'fp32 ms':>10}{'default ms':>12}"
          f"{'ratio':>8}")  # fmt: skip
    for scale in scales:
        model = DeepseekV3Model(model_config(scale)).to(_device())
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        fp32 = MuonConfig(newton_schulz=NewtonSchulzConfig(dtype="float32", method="standard"))
        optimizers: list[Muon] = [build_optimizer(model, fp32), build_optimizer(model)]
        layouts, _ = matrix_layouts(model)
        count = sum(layout.count(tuple(p.shape)) for p, layout in layouts.items())
        numel = sum(p.numel() for p in model.parameters())
        slow, fast = timed([o.step for o in optimizers], repeats)
        print(f"{scale:>6}{numel / 1e6:>12.2f}{count:>10}{slow * 1e3:>10.1f}{fast * 1e3:>12.1f}"
              f"{slow / fast:>8.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["ns", "a", "b", "c", "calibrate", "all"],
                        default="all")  # fmt: skip
    parser.add_argument("--scale", type=int, default=2, help="model width multiplier, (a)/(b)")
    parser.add_argument("--worlds", default="4,8", help="world sizes for (b)")
    parser.add_argument("--dense-group", type=int, default=2, help="dense shard group, (b)")
    parser.add_argument("--scales", default="1,2,4", help="model scales for (c)")
    parser.add_argument("--shapes", default="256x896,192x1536,1024x128,256x256",
                        help="matrix shapes for (ns)")  # fmt: skip
    parser.add_argument("--batch", type=int, default=4, help="matrices per call, (ns)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="kimi-k2", help="calibrate: whose shapes to time")
    parser.add_argument("--device-name", default="cpu", help="calibrate: the entry to write")
    parser.add_argument("--out", default="training/plan/calibration.yaml", help="calibrate")
    parser.add_argument(
        "--reduced",
        action="store_true",
        help="calibrate: the bench's small model, small buffers, one repeat",
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.manual_seed(0)
    if args.part == "calibrate":
        calibrate(args, model_config(1))
        return
    if args.part in ("ns", "all"):
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        part_ns(shapes, args.batch, args.repeats)  # type: ignore[arg-type]
    if args.part in ("a", "all"):
        part_a(args.scale, args.repeats)
    if args.part in ("b", "all"):
        part_b([int(w) for w in args.worlds.split(",")], args.scale, args.dense_group,
               args.repeats)  # fmt: skip
    if args.part in ("c", "all"):
        part_c([int(s) for s in args.scales.split(",")], args.repeats)


if __name__ == "__main__":
    main()
