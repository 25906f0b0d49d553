"""Variant specs: one file renders every tier's engine arguments."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest

from serving.settings import ServingSettings
from serving.variants import VariantError, engine_args_to_cli, load_variants
from tests.support.commands import cstack_command


def book():  # type: ignore[no-untyped-def]
    return load_variants(ServingSettings().variants_file)


def test_fast_is_speculative_and_small_batch_in_production() -> None:
    fast = book().engine_args("fast", "gpu")
    standard = book().engine_args("standard", "gpu")
    assert json.loads(fast["speculative-config"])["method"] == "mtp"
    assert "speculative-config" not in standard
    assert fast["max-num-seqs"] < standard["max-num-seqs"]


def test_shared_engine_prioritises_fast() -> None:
    shared = book().variant("shared")
    assert shared.engine_args["scheduling-policy"] == "priority"
    # vLLM schedules the lower number first.
    assert shared.tier_priority["fast"] < shared.tier_priority["standard"]


def test_cpu_profile_drops_gpu_only_arguments() -> None:
    args = book().engine_args("fast", "cpu")
    for gpu_only in ("tensor-parallel-size", "speculative-config", "gpu-memory-utilization"):
        assert gpu_only not in args
    assert args["max-model-len"] == 2048


def test_every_variant_parses_reasoning() -> None:
    """The gateway sends thinking budgets to every engine: each must run a reasoning
    parser, or vLLM refuses thinking_token_budget (and reasoning comes back as content)."""
    for variant in ("standard", "fast", "shared"):
        assert book().engine_args(variant, "gpu")["reasoning-parser"] == "kimi_k2"
        cpu = book().engine_args(variant, "cpu")
        # The tiny template thinks only when asked: serving/reasoning.py's parser.
        assert cpu["reasoning-parser"] == "composer_tiny"
        assert importlib.import_module(cpu["reasoning-parser-plugin"])


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("reasoning: {thinking_budgets: {turbo: 5}}", "unknown effort"),
        ("reasoning: {thinking_budgets: {none: 5}}", "effort none never thinks"),
        ("reasoning: {thinking_budgets: {low: 0}}", "positive token counts"),
        ("reasoning: {thinking_budgets: {low: many}}", "positive token counts"),
        ("slot_sharing: {fair_headroom: -1}", "fair_headroom must be a whole number"),
        ("slot_sharing: {fair_headroom: 1.5}", "fair_headroom must be a whole number"),
        ("slot_sharing: {standard_min_share: 0.9}", "0 <= min <= max <= 1"),
        ("slot_sharing: {keep_s: -0.1}", "keep_s must be seconds from 0 to 10"),
        ("slot_sharing: {keep_s: soon}", "keep_s must be seconds from 0 to 10"),
    ],
)
def test_bad_sections_are_refused_naming_the_field(
    tmp_path: Path, section: str, message: str
) -> None:
    (tmp_path / "v.yaml").write_text(f"variants: {{fast: {{}}, standard: {{}}}}\n{section}\n")
    with pytest.raises(VariantError, match=message):
        load_variants(tmp_path / "v.yaml")


def test_fair_headroom_can_be_turned_off(tmp_path: Path) -> None:
    (tmp_path / "v.yaml").write_text(
        "variants: {fast: {}, standard: {}}\nslot_sharing: {fair_headroom: 0}\n"
    )
    assert load_variants(tmp_path / "v.yaml").slot_sharing.fair_headroom == 0


def test_cli_flags() -> None:
    flags = engine_args_to_cli({"a-b": 1, "on": True, "off": False, "j": {"k": 1}})
    assert flags == ["--a-b", "1", "--on", "--no-off", "--j", '{"k": 1}']


def test_unknown_variant_and_profile_name_the_choices() -> None:
    with pytest.raises(VariantError, match=r"unknown variant 'turbo' \(known: fast, shared"):
        book().variant("turbo")
    with pytest.raises(VariantError, match="unknown profile 'tpu'"):
        book().engine_args("fast", "tpu")


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(VariantError, match="not found"):
        load_variants(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("variants: [unclosed")
    with pytest.raises(VariantError, match="not valid YAML"):
        load_variants(tmp_path / "bad.yaml")
    (tmp_path / "partial.yaml").write_text("variants:\n  fast: {engine_args: {}}\n")
    with pytest.raises(VariantError, match="lacks the 'standard' variant"):
        load_variants(tmp_path / "partial.yaml")


def test_serve_print_args_and_bad_variant(tiny_model: Path) -> None:
    printed = subprocess.run(
        cstack_command("serve", "--model", str(tiny_model), "--variant", "fast", "--print-args"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "vllm.entrypoints.openai.api_server" in printed
    assert "--served-model-name composer-2.5" in printed
    bad = subprocess.run(
        cstack_command("serve", "--model", str(tiny_model), "--variant", "turbo"),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "--variant" in bad.stderr and "Traceback" not in bad.stderr


def test_weight_sync_adds_dev_endpoints_and_the_reload_extension(tiny_model: Path) -> None:
    from serving.engine import engine_for_variant

    plain = engine_for_variant("shared", tiny_model, 8100)
    synced = engine_for_variant("shared", tiny_model, 8100, weight_sync=True)
    assert "VLLM_SERVER_DEV_MODE" not in plain.env
    assert "--worker-extension-cls" not in plain.command
    assert synced.env["VLLM_SERVER_DEV_MODE"] == "1"
    extension = synced.command[synced.command.index("--worker-extension-cls") + 1]
    module, _, cls = extension.rpartition(".")
    # The class vLLM's workers will import must exist where the variants file says.
    assert hasattr(importlib.import_module(module), cls)
    from training.rl.rollouts.vllm_extension import WORKER_EXTENSION

    assert extension == WORKER_EXTENSION


def test_speculative_keeps_the_fast_variants_drafting_on_cpu(tiny_model: Path) -> None:
    from serving.engine import engine_for_variant

    settings = ServingSettings(serving_profile="cpu")
    drafting = load_variants(settings.variants_file).variant("fast").engine_args
    plain = engine_for_variant("fast", tiny_model, 8100, settings=settings)
    kept = engine_for_variant("fast", tiny_model, 8100, settings=settings, speculative=True)
    assert "--speculative-config" not in plain.command  # the cpu profile drops it
    flag = kept.command.index("--speculative-config")
    assert kept.command[flag + 1] == drafting["speculative-config"]
    assert "--max-num-seqs" in kept.command  # the rest of the cpu profile still applies
