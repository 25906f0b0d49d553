"""Serving: tier variants, the vLLM launcher and the tiny dev/test checkpoint."""

from serving.engine import engine_for_variant
from serving.launcher import VllmServer
from serving.process import ManagedProcess, ServerStartError, StopRequested, stop_signals_raise
from serving.profile import detect_profile
from serving.settings import ServingSettings
from serving.tiny import build_tiny_checkpoint
from serving.variants import TIERS, Variant, VariantBook, VariantError, load_variants

__all__ = [
    "TIERS",
    "ManagedProcess",
    "ServerStartError",
    "ServingSettings",
    "StopRequested",
    "Variant",
    "VariantBook",
    "VariantError",
    "VllmServer",
    "build_tiny_checkpoint",
    "detect_profile",
    "engine_for_variant",
    "load_variants",
    "stop_signals_raise",
]
