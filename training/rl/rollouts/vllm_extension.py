"""Runs inside vLLM's worker processes (``--worker-extension-cls``): an exact in-place reload.

vLLM's ``reload_weights`` re-runs each layer's post-load processing on the new weights,
except one step: on a weight update the unquantized MoE method skips its experts' own
post-load hook, because it builds the kernel only once and on GPU that hook does nothing.
On CPU the hook is the repack of ``w13``/``w2`` into the grouped-GEMM layout. After a
plain reload the routed experts therefore hold checkpoint-layout bytes that the kernel
reads as packed ones. Outputs drift, and reloading the original checkpoint does not bring
back the original engine. With the tiny model, ``/weight_checker`` showed exactly the two
expert tensors differing from a fresh load (vLLM 0.32). This extension reloads, then runs
that skipped hook in place.

``reload_weights`` also reloads only the target model, never the speculative drafter: an
engine drafting with the checkpoint's MTP layers (the fast variant) would go on drafting
with the layers it started with. So an MTP drafter is reloaded from the same checkpoint
too. It shares the embedding and output head with the target (vLLM's MTP proposer), so
those load twice, with the same values. Other drafters (an EAGLE head, a separate draft
model) are not in the trainer's checkpoint and stay as they are.

``cstack_receive_weights`` is the same reload fed from the trainer's broadcast instead of
from disk (weight_transport.py).

On CPUs with AMX tiles, vLLM 0.32 packs MLA's up-projections (its AMX MLA backend) and
small linear weights (its sgl GEMM) into tensors only its kernels hold, leaving the layers
empty weights: an in-place reload then fails ("The size of tensor a (0) must match the size
of tensor b (512)") and leaves the engine paused. So a worker that loads this extension
runs vLLM's kernels for CPUs without AMX (``_without_amx``, when the worker imports this
module, before it builds the model; the engine is also started with the reference CPU MLA
backend, the variants file's ``weight_sync`` profile for CPUs, so that its block size
agrees).

Only vLLM, torch and the torch-only weight_transport are imported here, and only inside the
methods or in a process that has imported vLLM already: this module is loaded by every vLLM
worker process.
"""

from __future__ import annotations

import sys
from typing import Any

#: ``--worker-extension-cls`` value for engines the RL trainer pushes weights into.
WORKER_EXTENSION = "training.rl.rollouts.vllm_extension.WeightReloadExtension"
#: Bumped when the RPC methods below change, so a trainer can refuse an older engine.
PROTOCOL_VERSION = 3


class WeightReloadExtension:
    """Mixed into vLLM's Worker class; methods are called through ``/collective_rpc``.

    Every name carries the ``cstack_`` prefix: vLLM refuses an extension attribute that
    the Worker already has.
    """

    def cstack_weight_sync_info(self) -> dict[str, Any]:
        """Lets the trainer check that the engine runs this extension before pausing it."""
        return {"extension": WORKER_EXTENSION, "protocol": PROTOCOL_VERSION}

    def cstack_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """Reload an HF checkpoint in place into the model and its MTP drafter (if it has
        one), then repack what the reloads left unpacked."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        # The target's reload pointed the model config at the new checkpoint; the drafter
        # (an MTP model) picks its own layers out of the same files.
        result = self._cstack_finish_reload(None)
        return {"weights_path": weights_path, **result}

    def cstack_receive_weights(
        self, rendezvous: dict[str, Any], buckets: list[list[Any]]
    ) -> dict[str, Any]:
        """Join the trainer's push group (weight_transport.py) and reload the model in place
        from the tensors it broadcasts, as they arrive; the MTP drafter (if any) then
        reloads from the ones it loads too. The tensors are an HF export's, so the result
        is a disk reload's, byte for byte."""
        import contextlib
        import re

        from training.rl.rollouts.weight_transport import TensorSpec, open_group, receive_buckets

        # Whatever can fail on its own fails before joining: a rank that leaves the group
        # midway leaves the others waiting on it until their timeout.
        plan = [[TensorSpec.from_json(spec) for spec in bucket] for bucket in buckets]
        config = self.vllm_config  # type: ignore[attr-defined]
        decoder_layers = config.model_config.hf_text_config.num_hidden_layers
        wants_drafter = self._cstack_mtp_drafter() is not None
        # A multimodal checkpoint (Kimi K2.5) holds the layers under language_model.
        layer_key = re.compile(r"^(?:language_model\.)?model\.layers\.(\d+)\.")
        group = open_group(
            str(rendezvous["host"]),
            int(rendezvous["port"]),
            int(rendezvous["first_rank"]) + self.rank,  # type: ignore[attr-defined]
            int(rendezvous["world_size"]),
            str(rendezvous["token"]),
            float(rendezvous["timeout_s"]),
        )
        # What the drafter loads: everything but the target's own decoder layers (its MTP
        # layers, the shared embedding and head, the final norm).
        for_drafter: list[tuple[str, Any]] = []
        received = 0

        def weights() -> Any:
            nonlocal received
            for name, tensor in receive_buckets(group, plan):
                layer = layer_key.match(name)
                if wants_drafter and not (layer and int(layer.group(1)) < decoder_layers):
                    for_drafter.append((name, tensor))
                received += tensor.numel() * tensor.element_size()
                yield name, tensor

        stream = weights()
        try:
            self.reload_weights(weights_iterator=stream, is_checkpoint_format=True)  # type: ignore[attr-defined]
        except BaseException:
            # Every rank takes part in every broadcast: the others go on without waiting.
            with contextlib.suppress(Exception):
                for _ in stream:
                    pass
            raise
        for _ in stream:  # what the reload left unread (nothing, for vLLM's loaders)
            pass
        result = self._cstack_finish_reload(for_drafter if wants_drafter else None)
        return {"received_bytes": received, "buckets": len(plan), **result}

    def _cstack_mtp_drafter(self) -> Any:
        """The MTP drafter model this engine speculates with, or None."""
        speculative = self.vllm_config.speculative_config  # type: ignore[attr-defined]
        if speculative is None or speculative.method != "mtp":
            return None
        runner = self.model_runner  # type: ignore[attr-defined]
        return getattr(getattr(runner, "drafter", None), "model", None)

    def _cstack_finish_reload(
        self, drafter_weights: list[tuple[str, Any]] | None
    ) -> dict[str, Any]:
        """After the target's reload: reload the MTP drafter (from ``drafter_weights``, or
        from the checkpoint the target's reload pointed the config at), then repack."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        models = [self.model_runner.get_model()]  # type: ignore[attr-defined]
        drafter = self._cstack_mtp_drafter()
        if drafter is not None:
            config = self.vllm_config  # type: ignore[attr-defined]
            weights = None if drafter_weights is None else iter(drafter_weights)
            with set_current_vllm_config(config):
                reload_weights(config, drafter, weights, None, is_checkpoint_format=True)
            models.append(drafter)
        repacked = sum(self._cstack_repack_cpu_experts(model) for model in models)
        return {"repacked_moe_layers": repacked, "reloaded_drafter": drafter is not None}

    @staticmethod
    def _cstack_repack_cpu_experts(model: Any) -> int:
        import torch
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        repacked = 0
        with torch.no_grad():
            for module in model.modules():
                kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
                experts = getattr(kernel, "fused_experts", None)
                if not isinstance(experts, CPUUnquantizedExperts):
                    continue
                kept = {name: getattr(module, name) for name in ("w13_weight", "w2_weight")}
                experts.process_weights_after_loading(module)  # registers new Parameters
                for name, param in kept.items():
                    packed = getattr(module, name)
                    if packed is not param:
                        # Back into the original storage: compiled graphs hold references.
                        param.data.copy_(packed.data)
                        module.register_parameter(name, param)
                repacked += 1
        return repacked


def _without_amx() -> None:
    """In a vLLM process: report no AMX tiles to vLLM's kernel choices (see the module
    docstring); elsewhere (the trainer reads this module's constants) nothing."""
    if "vllm" not in sys.modules:
        return
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False


_without_amx()
