"""The Dockerfiles build what the chart runs (no Docker daemon here: checked statically)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chart_support import CHART, REPO

DOCKER = REPO / "deploy" / "docker"
IMAGES = ["app", "vllm", "trainer"]


def instructions(name: str) -> list[tuple[str, str]]:
    text = (DOCKER / f"{name}.Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.parametrize("name", IMAGES)
def test_image_runs_as_the_charts_non_root_user(name: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    users = [arg for op, arg in instructions(name) if op == "USER"]
    assert users and users[-1] == f"{uid}:{values['podSecurityContext']['runAsGroup']}"


@pytest.mark.parametrize("name", IMAGES)
def test_copied_sources_exist(name: str) -> None:
    for op, arg in instructions(name):
        if op == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert (REPO / source).exists(), source


@pytest.mark.parametrize("name", ["vllm", "trainer"])
def test_engine_images_use_the_charts_vllm_release(name: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = values["vllmImage"]
    bases = [arg for op, arg in instructions(name) if op == "FROM"]
    assert bases == [f"{image['repository']}:{image['tag']}"]


def test_vllm_image_starts_the_server_the_chart_and_serving_start() -> None:
    entrypoint = next(arg for op, arg in instructions("vllm") if op == "ENTRYPOINT")
    assert re.fullmatch(r'\["python3", "-m", "vllm\.entrypoints\.openai\.api_server"\]', entrypoint)


def test_vllm_image_ships_its_plugins_and_nothing_they_need_besides(
    tmp_path: Path,
) -> None:
    """The files the vLLM image copies import on their own (lazy package exports), and
    they hold the extension class the variants file's weight_sync section names and the
    reasoning parser plugin its cpu profile names."""
    from serving.variants import load_variants

    copies = [arg.split() for op, arg in instructions("vllm") if op == "COPY"]
    for source, target in copies:
        destination = tmp_path / Path(target).relative_to("/opt/cstack")
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / source, destination)
    assert ("ENV", "PYTHONPATH=/opt/cstack") in instructions("vllm")
    extension = load_variants(REPO / "serving" / "variants.yaml").weight_sync.engine_args[
        "worker-extension-cls"
    ]
    module, _, name = str(extension).rpartition(".")
    probe = f"import importlib; print(getattr(importlib.import_module({module!r}), {name!r}))"
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {probe}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert name in result.stdout
    # The cpu profile's reasoning parser plugin imports from the copies alone too.
    plugin = load_variants(REPO / "serving" / "variants.yaml").engine_args("shared", "cpu")[
        "reasoning-parser-plugin"
    ]
    probe = f"import importlib; print(importlib.import_module({plugin!r}).NAME)"
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {probe}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "composer_tiny"
