"""The Dockerfiles build what the chart runs (no Docker daemon here: checked statically)."""

from __future__ import annotations

import re

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
