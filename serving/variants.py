"""Variant specs: which vLLM engine arguments each tier is served with.

The YAML file is the single source of truth; the Helm chart renders the same arguments
(``cstack serve --print-args`` shows them), so production and the embedded stack cannot
drift apart silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from serving.vocabulary import REASONING_EFFORTS, STANDARD_MAX_SHARE, STANDARD_MIN_SHARE, TIERS


class VariantError(ValueError):
    """The variants file or a requested variant/profile is not usable."""


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    engine_args: dict[str, Any]
    #: vLLM request priority per tier, only for an engine shared by several tiers.
    tier_priority: dict[str, int] = field(default_factory=dict)
    #: Output tokens per streamed chunk per tier (vLLM's ``stream_interval``; 1 when
    #: absent), only for an engine shared by several tiers.
    tier_stream_interval: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightSync:
    """Environment and engine arguments that let a trainer swap weights into an engine."""

    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    #: Further engine arguments under a serving profile (``cpu``, ``gpu``).
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    def engine_args_for(self, profile: str) -> dict[str, Any]:
        return {**self.engine_args, **self.profiles.get(profile, {})}


@dataclass(frozen=True)
class SlotSharing:
    """How the gateway shares an engine's request slots between tiers (the file's
    ``slot_sharing`` section says what each field means)."""

    standard_max_share: float = STANDARD_MAX_SHARE
    standard_min_share: float = STANDARD_MIN_SHARE
    max_queue_wait_s: dict[str, float] = field(
        default_factory=lambda: {"fast": 10.0, "standard": 60.0}
    )
    fair_headroom: int = 2
    keep_s: float = 0.05


@dataclass(frozen=True)
class VariantBook:
    served_model_name: str
    variants: dict[str, Variant]
    profiles: dict[str, dict[str, Any]]
    weight_sync: WeightSync = field(default_factory=WeightSync)
    slot_sharing: SlotSharing = field(default_factory=SlotSharing)
    #: Thinking-token budget per ``reasoning_effort`` (the file's ``reasoning`` section);
    #: an effort without one does not think.
    thinking_budgets: dict[str, int] = field(default_factory=dict)

    def max_num_seqs(self, variant: str, profile: str) -> int | None:
        """The batch size an engine of ``variant`` runs with (None: vLLM's default)."""
        value = self.engine_args(variant, profile).get("max-num-seqs")
        return None if value is None else int(value)

    def variant(self, name: str) -> Variant:
        try:
            return self.variants[name]
        except KeyError:
            known = ", ".join(sorted(self.variants))
            raise VariantError(f"unknown variant {name!r} (known: {known})") from None

    def engine_args(self, variant: str, profile: str) -> dict[str, Any]:
        """The variant's arguments with the profile overlaid (``None`` removes one)."""
        if profile not in self.profiles:
            known = ", ".join(sorted(self.profiles))
            raise VariantError(f"unknown profile {profile!r} (known: {known})")
        merged = dict(self.variant(variant).engine_args)
        for key, value in self.profiles[profile].items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return merged

    def cli_args(self, variant: str, profile: str) -> list[str]:
        """Engine arguments as vLLM command-line flags."""
        return engine_args_to_cli(self.engine_args(variant, profile))


def engine_args_to_cli(args: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for key, value in args.items():
        flag = f"--{key}"
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append(f"--no-{key}")
        elif isinstance(value, dict | list):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def load_variants(path: Path) -> VariantBook:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise VariantError(f"variants file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise VariantError(f"variants file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or "variants" not in raw:
        raise VariantError(f"variants file {path} has no 'variants' section")
    variants = {
        name: Variant(
            name=name,
            description=str(spec.get("description", "")),
            engine_args=dict(spec.get("engine_args") or {}),
            tier_priority={k: int(v) for k, v in (spec.get("tier_priority") or {}).items()},
            tier_stream_interval={
                k: int(v) for k, v in (spec.get("tier_stream_interval") or {}).items()
            },
        )
        for name, spec in raw["variants"].items()
    }
    for tier in TIERS:
        if tier not in variants:
            raise VariantError(f"variants file {path} lacks the {tier!r} variant")
    sync = raw.get("weight_sync") or {}
    return VariantBook(
        slot_sharing=_slot_sharing(raw.get("slot_sharing") or {}, path),
        thinking_budgets=_thinking_budgets(raw.get("reasoning") or {}, path),
        served_model_name=str(raw.get("served_model_name", "composer-2.5")),
        variants=variants,
        profiles={k: dict(v or {}) for k, v in (raw.get("profiles") or {}).items()},
        weight_sync=WeightSync(
            env={k: str(v) for k, v in (sync.get("env") or {}).items()},
            engine_args=dict(sync.get("engine_args") or {}),
            profiles={k: dict(v or {}) for k, v in (sync.get("profiles") or {}).items()},
        ),
    )


def _thinking_budgets(raw: dict[str, Any], path: Path) -> dict[str, int]:
    budgets = dict(raw.get("thinking_budgets") or {})
    unknown = set(budgets) - set(REASONING_EFFORTS)
    if unknown:
        raise VariantError(f"{path}: reasoning.thinking_budgets: unknown effort {sorted(unknown)}")
    if "none" in budgets:
        raise VariantError(f"{path}: reasoning.thinking_budgets: effort none never thinks")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in budgets.values()):
        raise VariantError(f"{path}: reasoning.thinking_budgets must be positive token counts")
    return budgets


def _slot_sharing(raw: dict[str, Any], path: Path) -> SlotSharing:
    defaults = SlotSharing()
    waits = {**defaults.max_queue_wait_s, **(raw.get("max_queue_wait_s") or {})}
    sharing = SlotSharing(
        standard_max_share=float(raw.get("standard_max_share", defaults.standard_max_share)),
        standard_min_share=float(raw.get("standard_min_share", defaults.standard_min_share)),
        max_queue_wait_s={tier: float(wait) for tier, wait in waits.items()},
        fair_headroom=raw.get("fair_headroom", defaults.fair_headroom),
        keep_s=raw.get("keep_s", defaults.keep_s),
    )
    if not isinstance(sharing.fair_headroom, int) or sharing.fair_headroom < 0:
        raise VariantError(f"{path}: slot_sharing.fair_headroom must be a whole number >= 0")
    keep = sharing.keep_s
    if isinstance(keep, bool) or not isinstance(keep, int | float) or not 0 <= keep <= 10:
        raise VariantError(f"{path}: slot_sharing.keep_s must be seconds from 0 to 10")
    shares = (sharing.standard_min_share, sharing.standard_max_share)
    if not 0 <= shares[0] <= shares[1] <= 1:
        raise VariantError(f"{path}: slot_sharing shares must be 0 <= min <= max <= 1")
    if set(sharing.max_queue_wait_s) != set(TIERS) or min(waits.values()) <= 0:
        raise VariantError(f"{path}: slot_sharing.max_queue_wait_s needs a positive wait per tier")
    return sharing
