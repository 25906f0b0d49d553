"""Pick the engine profile (cpu or gpu) for the hardware present."""

from __future__ import annotations

import shutil


def detect_profile(configured: str = "") -> str:
    if configured:
        return configured
    # nvidia-smi is present exactly where the `gpu` extra can run; importing torch here
    # would cost seconds on every CLI call.
    return "gpu" if shutil.which("nvidia-smi") else "cpu"
