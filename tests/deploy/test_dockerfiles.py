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
    # The build context admits exactly what the image copies.
    ignore = (REPO / "deploy" / "docker" / "vllm.Dockerfile.dockerignore").read_text()
    admitted = {line[1:] for line in ignore.splitlines() if line.startswith("!")}
    assert admitted == {source for source, _ in copies}
    variants = load_variants(REPO / "serving" / "variants.yaml")
    module, _, name = str(variants.weight_sync.engine_args["worker-extension-cls"]).rpartition(".")
    assert name in _import_from(tmp_path, f"getattr(importlib.import_module({module!r}), {name!r})")
    # What a streamed push's worker imports, inside the extension's method.
    assert "open_group" in _import_from(
        tmp_path, "dir(importlib.import_module('training.rl.rollouts.weight_transport'))"
    )
    # The cpu profile's reasoning parser plugin imports from the copies alone too.
    plugin = variants.engine_args("shared", "cpu")["reasoning-parser-plugin"]
    assert _import_from(tmp_path, f"importlib.import_module({plugin!r}).NAME") == "composer_tiny"


def _import_from(root: Path, expression: str) -> str:
    """``expression`` printed by an isolated interpreter that sees only ``root``'s files."""
    probe = f"import importlib, sys; sys.path.insert(0, {str(root)!r}); print({expression})"
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, cwd=root
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_app_image_installs_the_tested_versions() -> None:
    """The gateway and billing reach into uvicorn's and redis-py's internals, so the image
    that runs them installs exactly what CI tested (the constraints file), uvicorn and
    redis pinned to one version each."""
    installs = [arg for op, arg in instructions("app") if op == "RUN" and "pip install" in arg]
    assert installs and "-c constraints-cpu.txt" in installs[0]
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "constraints-cpu.txt").read_text().splitlines()
        if "==" in line
    )
    for private_api_user in ("uvicorn", "redis", "httptools"):
        assert pins.get(private_api_user), private_api_user
    ignore = (DOCKER / "app.Dockerfile.dockerignore").read_text().splitlines()
    assert "!constraints-cpu.txt" in ignore
