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

Only vLLM and torch are imported here, and only inside the methods: this module is loaded
by every vLLM worker process.
"""

from __future__ import annotations

from typing import Any

#: ``--worker-extension-cls`` value for engines the RL trainer pushes weights into.
WORKER_EXTENSION = "training.rollouts.vllm_extension.WeightReloadExtension"
#: Bumped when the RPC methods below change, so a trainer can refuse an older engine.
PROTOCOL_VERSION = 1


class WeightReloadExtension:
    """Mixed into vLLM's Worker class; methods are called through ``/collective_rpc``.

    Every name carries the ``cstack_`` prefix: vLLM refuses an extension attribute that
    the Worker already has.
    """

    def cstack_weight_sync_info(self) -> dict[str, Any]:
        """Lets the trainer check that the engine runs this extension before pausing it."""
        return {"extension": WORKER_EXTENSION, "protocol": PROTOCOL_VERSION}

    def cstack_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """Reload an HF checkpoint in place, then repack what the reload left unpacked."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        repacked = self._cstack_repack_cpu_experts()
        return {"weights_path": weights_path, "repacked_moe_layers": repacked}

    def _cstack_repack_cpu_experts(self) -> int:
        import torch
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
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
