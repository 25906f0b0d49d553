"""Weight sync into the running vLLM: new weights change its outputs, the version advances,
and pushing the original checkpoint restores the engine bit for bit (vLLM's own weight
digests, ``/weight_checker``). Needs vLLM's dev endpoints (VLLM_SERVER_DEV_MODE=1).

An engine without the worker extension is refused before anything is paused or loaded:
vLLM's plain reload leaves CPU MoE experts in the wrong layout (vllm_extension.py).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch


def _greedy(vllm_url: str) -> list[int]:
    response = httpx.post(
        f"{vllm_url}/v1/chat/completions",
        json={"model": "composer-2.5", "messages": [{"role": "user", "content": "Count: 1 2 3"}],
              "max_tokens": 8, "temperature": 0.0, "return_token_ids": True},
        timeout=120,
    )  # fmt: skip
    response.raise_for_status()
    return list(response.json()["choices"][0]["token_ids"])


def _digests(vllm_url: str) -> dict[str, str]:
    response = httpx.post(f"{vllm_url}/weight_checker", json={"action": "checksum"}, timeout=120)
    response.raise_for_status()
    return dict(response.json()["checksums"])


def _changed_checkpoint(tiny_model: Path, out: Path) -> Path:
    from training.models.deepseek_v3.model import DeepseekV3Model

    model = DeepseekV3Model.from_pretrained(tiny_model)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # a different policy, same architecture
        for name, param in model.named_parameters():
            if ".experts." in name:  # the routed experts: the tensors a plain reload garbles
                param.mul_(0.5)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"):  # fmt: skip
        if (tiny_model / name).exists():
            shutil.copy2(tiny_model / name, out / name)
    return out


def _has_extension(vllm_url: str) -> bool:
    probe = {"method": "cstack_weight_sync_info"}
    return httpx.post(f"{vllm_url}/collective_rpc", json=probe, timeout=60).status_code == 200


@pytest.mark.vllm
def test_push_changes_outputs_and_restores_the_engine_exactly(
    vllm_url: str, redis_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync, WeightSyncError

    if httpx.get(f"{vllm_url}/is_paused", timeout=30).status_code == 404:
        pytest.skip("this vLLM runs without VLLM_SERVER_DEV_MODE=1 (no weight reload endpoints)")

    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"sync-{uuid.uuid4().hex}")
    sync = VllmWeightSync([vllm_url], gate)
    original, digests = _greedy(vllm_url), _digests(vllm_url)
    changed = _changed_checkpoint(tiny_model, tmp_path / "changed")

    if not _has_extension(vllm_url):
        with pytest.raises(WeightSyncError, match="--worker-extension-cls"):
            sync.push(changed)
        assert gate.version() == 0 and _digests(vllm_url) == digests  # nothing was touched
        return

    try:
        assert sync.push(changed) == 1
        assert sync.engine_version(vllm_url) == "1"
        moved = {
            key.rsplit(":", 1)[-1] for key, d in _digests(vllm_url).items() if d != digests[key]
        }
        assert "lm_head.weight" in moved
        assert any("experts" in key for key in moved)
        assert _greedy(vllm_url) != original
    finally:
        assert sync.push(tiny_model) == 2  # leave the shared engine as we found it
    assert sync.engine_version(vllm_url) == "2"
    assert _digests(vllm_url) == digests
    assert _greedy(vllm_url) == original


@pytest.mark.vllm
def test_a_streamed_push_loads_exactly_what_a_disk_push_loads(
    vllm_url: str, redis_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """The tensors of an export, broadcast in small buckets over the push's gloo group
    (several tensors per bucket, and tensors alone in theirs), leave the engine with the
    weight digests and greedy answer of the disk push of that export; streaming the
    original checkpoint back restores the engine bit for bit."""
    from training.models.deepseek_v3.hf_io import read_hf_tensors
    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync, WeightSyncError

    if httpx.get(f"{vllm_url}/is_paused", timeout=30).status_code == 404:
        pytest.skip("this vLLM runs without VLLM_SERVER_DEV_MODE=1 (no weight reload endpoints)")
    if not _has_extension(vllm_url):
        pytest.skip("this vLLM runs without the weight-sync worker extension")
    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"sync-{uuid.uuid4().hex}")
    sync = VllmWeightSync([vllm_url], gate, bucket_bytes=2**20)
    original, digests = _greedy(vllm_url), _digests(vllm_url)
    changed = _changed_checkpoint(tiny_model, tmp_path / "changed")
    try:
        sync.push(changed)
        on_disk, answer_on_disk = _digests(vllm_url), _greedy(vllm_url)
        sync.push(tiny_model)
        assert _digests(vllm_url) == digests

        assert sync.push_weights(read_hf_tensors(changed)) == 3
        assert sync.engine_version(vllm_url) == "3"
        assert _digests(vllm_url) == on_disk != digests
        assert _greedy(vllm_url) == answer_on_disk != original
        assert sync.push_weights(read_hf_tensors(tiny_model)) == 4
        assert _digests(vllm_url) == digests
        assert _greedy(vllm_url) == original

        # A worker that fails mid-push (a tensor its model has no place for) answers with
        # its error at once (the push does not wait out the group's timeout), and the
        # engine stays paused, as it may hold part of the new weights; the version stays.
        broken = {**read_hf_tensors(tiny_model), "model.no_such.weight": torch.zeros(4)}
        with pytest.raises(WeightSyncError, match=r"streamed reload.*Left paused"):
            sync.push_weights(broken)
        assert httpx.get(f"{vllm_url}/is_paused", timeout=30).json()["is_paused"] is True
        assert gate.version() == 4
    finally:
        sync.push(tiny_model)  # leave the shared engine as we found it, whatever failed
    assert httpx.get(f"{vllm_url}/is_paused", timeout=30).json()["is_paused"] is False


def test_a_streamed_push_to_remote_engines_needs_a_reachable_address(redis_url: str) -> None:
    """Remote engines would take the default loopback address for their own: refused
    before anything is paused, naming the setting."""
    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync, WeightSyncError

    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"sync-{uuid.uuid4().hex}")
    sync = VllmWeightSync(["http://10.255.0.1:8000"], gate, timeout_s=5)
    with pytest.raises(WeightSyncError, match="CSTACK_RL_WEIGHT_SYNC_HOST"):
        sync.push_weights({"lm_head.weight": torch.zeros(2)})
    assert gate.version() == 0


def test_engine_without_dev_endpoints_is_named(redis_url: str, tmp_path: Path) -> None:
    """A URL that is no vLLM dev server: the error names the engine and what to enable."""
    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync, WeightSyncError

    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"sync-{uuid.uuid4().hex}")
    with pytest.raises(WeightSyncError, match=r"127\.0\.0\.1:9: cannot reach"):
        VllmWeightSync(["http://127.0.0.1:9"], gate, timeout_s=5).push(tmp_path)
    assert gate.version() == 0


def test_replica_urls_expand_a_name_with_several_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A headless Service name resolves to every pod; each must get the weights. Its DNS
    cannot exist on this machine, so only that name's lookup is replaced here."""
    import socket

    from training.rl.rollouts.weight_sync import WeightSyncError, replica_urls

    assert replica_urls("http://127.0.0.1:8000/") == ["http://127.0.0.1:8000"]
    assert replica_urls("http://localhost:8000") == ["http://localhost:8000"]
    with pytest.raises(WeightSyncError, match=r"cannot resolve 'engine\.invalid'"):
        replica_urls("http://engine.invalid:8000")

    real_lookup = socket.getaddrinfo

    def lookup(host: str, port: int, *args: object, **kwargs: object) -> list[tuple]:  # type: ignore[type-arg]
        if host != "vllm-fast-pods":
            return real_lookup(host, port, *args, **kwargs)  # type: ignore[arg-type]
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
            for address in ("10.0.0.12", "10.0.0.7", "10.0.0.12")
        ]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert replica_urls("http://vllm-fast-pods:8000") == [
        "http://10.0.0.12:8000",
        "http://10.0.0.7:8000",
    ]
