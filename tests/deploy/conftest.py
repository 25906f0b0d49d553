"""Fixtures for the deployment tests: the chart rendered by Helm's own engine."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_support import CHART, PRODUCTION_VALUES, SECRET_REFERENCE, Manifest, Render


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(str(CHART)) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: helm.Chart) -> Render:
    """Render with ``values`` (merged over the chart defaults) into manifest dicts."""

    def _render(values: dict[str, Any]) -> list[Manifest]:
        rendered = chart.render(values, name="cs", namespace="composer", is_install=True)
        manifests: list[Manifest] = []
        for path, text in sorted(rendered.items()):
            if path.endswith("NOTES.txt"):
                continue
            manifests += [doc for doc in yaml.safe_load_all(text) if doc]
        return manifests

    return _render


@pytest.fixture(scope="session")
def production_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(PRODUCTION_VALUES.read_text())
    return values


@pytest.fixture(scope="session")
def default_manifests(render: Render) -> list[Manifest]:
    return render(SECRET_REFERENCE)


@pytest.fixture(scope="session")
def production_manifests(render: Render, production_values: dict[str, Any]) -> list[Manifest]:
    return render(production_values)


@pytest.fixture(scope="session")
def promtool() -> str:
    """Debian's promtool (package `prometheus`; .ci/run installs it)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: apt-get install prometheus")
    return path


@pytest.fixture(params=["default", "production"])
def manifests(
    request: pytest.FixtureRequest,
    default_manifests: list[Manifest],
    production_manifests: list[Manifest],
) -> list[Manifest]:
    """Each test taking this runs on both renders."""
    return default_manifests if request.param == "default" else production_manifests
