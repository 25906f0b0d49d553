"""`cstack plan`'s figures for the machine it runs on (``bench/muon.py --part calibrate``).

Measures, on CUDA when there is a GPU (else on CPU):
- Newton-Schulz throughput for every Muon matrix shape of ``--model``, in float32, bfloat16
  and float16, standard and (where it is cheaper) Gram: ``newton_schulz_shapes``; the
  shape with the most work in the model gives the per-precision ``newton_schulz_flops``;
- memory bandwidth of the optimizer's elementwise work (``lerp_``);
- all-to-all bandwidth between the GPUs of this machine (NCCL; gloo between two
  processes on CPU): ``intra_node_bandwidth``;
- the sharded Muon optimizer step on all of this machine's GPUs (two gloo ranks on CPU),
  dense weights and experts on the trainer's two meshes, next to what ``cstack plan``
  predicts for the same model and ranks from the figures just measured.
and writes them under ``--device-name`` into ``--out`` (the other devices are kept; GPU
memory and GPUs per node are read from the device, what one machine cannot measure, the
bandwidth between nodes, is kept from the file's entry or marked assumed).

``--reduced``: the bench's small model instead of ``--model`` (whose largest matrices a CPU
would take minutes each to time); with ``--repeats 1`` the tests run it in seconds on CPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from serving.process import free_port
from training.models.deepseek_v3.config import ModelConfig
from training.optim.config import NewtonSchulzConfig
from training.optim.newton_schulz import DTYPES, flops, orthogonalize, uses_gram
from training.plan.parts import Device, Layout, shape_key
from training.plan.plan import (
    CALIBRATION_FILE,
    load_model_config,
    model_params,
)

PRECISIONS = tuple(DTYPES)


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _best_seconds(fn: Any, repeats: int) -> float:
    import time

    fn()
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def newton_schulz_rates(
    model: ModelConfig, batch_elements: int, repeats: int
) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Per shape, precision and method, FLOP/s; the per-precision rate of the shape with
    the most work; and one printable line per shape."""
    work: dict[tuple[int, int], int] = {}
    for param in model_params(model):
        if param.muon:
            work[param.matrix] = work.get(param.matrix, 0) + param.count
    heaviest = max(work, key=lambda s: work[s] * flops(*s, NewtonSchulzConfig(method="standard")))
    shapes: dict[str, float] = {}
    generic: dict[str, float] = {}
    lines = []
    for rows, cols in sorted(work):
        batch = max(1, min(work[rows, cols], batch_elements // (rows * cols)))
        x = torch.randn(batch, rows, cols, device=_device())
        row = []
        for dtype in PRECISIONS:
            for method in ("standard", "gram"):
                ns = NewtonSchulzConfig(dtype=dtype, method=method)  # type: ignore[arg-type]
                gram = uses_gram(rows, cols, ns)
                if method == "gram" and not gram:
                    continue  # square: Gram falls back to the standard iteration
                seconds = _best_seconds(lambda ns=ns, x=x: orthogonalize(x, ns), repeats)
                rate = batch * flops(rows, cols, ns) / seconds
                shapes[shape_key(rows, cols, dtype, gram)] = rate
                row.append(f"{dtype} {method} {rate / 1e12:.3g}")
                if (rows, cols) == heaviest and method == "standard":
                    generic[dtype] = rate
        lines.append(f"  [{rows}, {cols}] x{batch}: " + ", ".join(row) + " TFLOP/s")
    return generic, shapes, lines


def memory_bandwidth(elements: int, repeats: int) -> float:
    buf = torch.zeros(elements, device=_device())
    grad = torch.randn(elements, device=_device())
    # lerp_ reads two tensors and writes one: the shape of Muon's and AdamW's updates.
    return 3 * elements * 4 / _best_seconds(lambda: buf.lerp_(grad, 0.05), repeats)


def _spawn(target: Any, world: int, *args: Any) -> list[Any]:
    ctx: Any = mp.get_context("spawn" if torch.cuda.is_available() else "fork")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, queue, *args)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return results


def _init(rank: int, world: int, port: int) -> str:
    nccl = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if nccl:
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)  # fmt: skip
    return "cuda" if nccl else "cpu"


def _all_to_all_worker(rank: int, world: int, port: int, queue: Any, numel: int,
                       repeats: int) -> None:  # fmt: skip
    device = _init(rank, world, port)
    send = torch.randn(numel, device=device)
    received = torch.empty_like(send)
    seconds = _best_seconds(lambda: dist.all_to_all_single(received, send), repeats)
    # Bytes that leave this rank (its own slice stays) per second.
    queue.put(numel * send.element_size() * (world - 1) / world / seconds)
    dist.destroy_process_group()


def link_bandwidth(world: int, numel: int, repeats: int) -> float:
    return min(_spawn(_all_to_all_worker, world, numel, repeats))


def _step_worker(rank: int, world: int, port: int, queue: Any, model: ModelConfig,
                 dense_group: int, repeats: int) -> None:  # fmt: skip
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from training.models.deepseek_v3.model import DeepseekV3Model
    from training.optim.muon import build_optimizer

    device = _init(rank, world, port)
    dense = init_device_mesh(device, (world // dense_group, dense_group))
    experts = init_device_mesh(device, (1, world))
    net = DeepseekV3Model(model)
    torch.manual_seed(0)
    for name, param in list(net.named_parameters()):
        mesh = experts if ".experts." in name else dense
        sharded = distribute_tensor(param.detach().to(device), mesh, [Replicate(), Shard(0)])
        module = net.get_submodule(name.rsplit(".", 1)[0])
        setattr(module, name.rsplit(".", 1)[1], nn.Parameter(sharded))
    optimizer = build_optimizer(net)
    generator = torch.Generator().manual_seed(1)  # the same full gradients on every rank
    for param in net.parameters():
        full = torch.randn(param.shape, generator=generator).to(device)
        param.grad = distribute_tensor(full, param.device_mesh, param.placements)  # type: ignore[attr-defined]

    def step() -> None:
        optimizer.step()
        dist.barrier()

    queue.put(_best_seconds(step, repeats))
    dist.destroy_process_group()


def sharded_step(model: ModelConfig, world: int, dense_group: int, device: Device,
                 repeats: int) -> dict[str, Any]:  # fmt: skip
    """The optimizer step measured (slowest rank) and predicted, for one model and layout."""
    import numpy as np

    from training.optim.config import MuonConfig
    from training.plan.muon_step import muon_step
    from training.plan.plan import local_numel

    measured = max(_spawn(_step_worker, world, model, dense_group, repeats))
    layout = Layout("dual mesh", world, dense_group, world, 1)
    params = model_params(model)
    adamw = np.zeros(world)
    for p in params:
        if not p.muon:
            adamw += [local_numel(p, layout, rank) for rank in range(world)]
    predicted = float(muon_step(params, layout, device, MuonConfig(), adamw).overlapped.max())
    what = (f"{sum(p.numel for p in params) / 1e6:.1f}M-parameter model on {world} rank(s), "
            f"dense group {dense_group}, EP {world}, the trainer's defaults")  # fmt: skip
    return {"measured_s": measured, "predicted_s": predicted, "what": what}


def step_model(args: Any, bench_model: ModelConfig, world: int) -> ModelConfig:
    """The model whose sharded step is measured: the bench's small one on CPU (or reduced),
    else ``--model``'s layer shapes in two layers (the first dense), with 8 experts per rank
    and a small vocabulary, so it fits one GPU per rank and its matrices are the real ones."""
    if args.reduced or not torch.cuda.is_available():
        return bench_model
    return dataclasses.replace(
        load_model_config(args.model), num_hidden_layers=2, first_k_dense_replace=1,
        n_routed_experts=8 * world, n_group=1, topk_group=1, vocab_size=1024,
        num_nextn_predict_layers=0,
    )  # fmt: skip


def calibrate(args: Any, bench_model: ModelConfig) -> None:
    on_gpu = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if on_gpu else 0
    model = bench_model if args.reduced else load_model_config(args.model)
    repeats = args.repeats
    name = torch.cuda.get_device_name() if on_gpu else "this CPU"
    command = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    measured = f"measured {datetime.date.today().isoformat()} on {name}: {command}"
    generic, shapes, lines = newton_schulz_rates(model, 1 << (27 if on_gpu else 20), repeats)
    bandwidth = memory_bandwidth(1 << (28 if on_gpu else 24), repeats)
    out = Path(args.out)
    text = out.read_text() if out.exists() else CALIBRATION_FILE.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    devices = (yaml.safe_load(text) or {}).get("devices", {})
    before = devices.get(args.device_name, {})
    kept = before.get("basis", {})
    entry: dict[str, Any] = {
        "newton_schulz_flops": generic,
        "newton_schulz_shapes": shapes,
        "memory_bandwidth": bandwidth,
    }
    basis = {
        "newton_schulz_flops": measured,
        "newton_schulz_shapes": f"{measured} ({len(shapes)} rates)",
        "memory_bandwidth": measured,
    }
    # Between ranks: NCCL across this machine's GPUs, two gloo processes on CPU; one GPU
    # alone has no peer, and keeps the file's figure.
    world = gpus if on_gpu else 2
    if world >= 2:
        entry["intra_node_bandwidth"] = link_bandwidth(world, 1 << (26 if on_gpu else 23), repeats)
        basis["intra_node_bandwidth"] = (
            f"{measured} ({'NCCL' if on_gpu else 'gloo'}, {world} ranks)"
        )
    else:
        entry["intra_node_bandwidth"] = before["intra_node_bandwidth"]
        basis["intra_node_bandwidth"] = kept.get("intra_node_bandwidth", "assumed")
    entry["inter_node_bandwidth"] = before.get(
        "inter_node_bandwidth", entry["intra_node_bandwidth"]
    )
    basis["inter_node_bandwidth"] = kept.get(
        "inter_node_bandwidth", "assumed: equal to intra_node_bandwidth (one machine)"
    )
    if on_gpu:
        entry["memory_bytes"] = float(torch.cuda.get_device_properties(0).total_memory)
        entry["gpus_per_node"] = gpus
        basis["memory_bytes"] = measured
    else:
        entry["memory_bytes"] = before.get("memory_bytes", 1.6e10)
        entry["gpus_per_node"] = before.get("gpus_per_node", 2)
        basis["memory_bytes"] = kept.get("memory_bytes", "assumed")
    entry["basis"] = basis
    device = Device(name=args.device_name, **entry)
    dense_group = 2 if world % 2 == 0 else 1
    entry["sharded_step"] = sharded_step(
        step_model(args, bench_model, world), world, dense_group, device, repeats
    )
    devices[args.device_name] = _rounded(entry)
    out.write_text(
        header + yaml.dump({"devices": devices}, Dumper=_Dumper, sort_keys=False, width=100)
    )
    print(f"calibration of {args.device_name} ({name}) written to {out}:")
    print("\n".join(lines))
    link = entry["intra_node_bandwidth"]
    print(f"  memory {bandwidth / 1e9:.3g} GB/s, all-to-all {link / 1e9:.3g} GB/s per rank")
    step = entry["sharded_step"]
    print(f"  sharded step {step['measured_s'] * 1e3:.1f} ms measured, "
          f"{step['predicted_s'] * 1e3:.1f} ms predicted ({step['what']})")  # fmt: skip


class _Dumper(yaml.SafeDumper):
    """Figures as 5.656e+10, not 56560000000.0 (the mantissa keeps its dot, so YAML still
    reads them as floats)."""


_Dumper.add_representer(
    float, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:float", f"{value:.3e}")
)


def _rounded(value: Any) -> Any:
    """Four significant digits: what a benchmark's figure carries."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
