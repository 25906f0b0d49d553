"""Paths and small helpers shared by the chart tests (picking objects out of manifests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "composer-stack"
PRODUCTION_VALUES = REPO / "helm" / "values-production.yaml"
#: Default values need one thing from the installer: where the secrets are. Referencing a
#: Secret managed elsewhere is how the chart is meant to be installed.
SECRET_REFERENCE: dict[str, Any] = {"secrets": {"existingSecret": "composer-stack-secrets"}}

Manifest = dict[str, Any]
#: Renders the chart with values merged over its defaults, into manifest dicts.
Render = Callable[[dict[str, Any]], list[Manifest]]


def find(manifests: list[Manifest], kind: str, name_suffix: str) -> Manifest:
    """The one manifest of ``kind`` whose name ends with ``name_suffix``."""
    matches = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, got {len(matches)}"
    return matches[0]


def pod_spec(manifest: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def containers(manifest: Manifest) -> list[dict[str, Any]]:
    spec = pod_spec(manifest)
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in {"Deployment", "StatefulSet", "Job"}]


def component_of(workload: Manifest) -> str:
    """The ``app.kubernetes.io/component`` label of a workload's pods."""
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels["app.kubernetes.io/component"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's env entries by name."""
    return {entry["name"]: entry for entry in container.get("env", [])}


def ingress_by_port(policy: Manifest) -> dict[str, list[list[dict[str, Any]] | None]]:
    """A NetworkPolicy's ingress rules by port name: each rule's peers (``None``: any)."""
    by_port: dict[str, list[list[dict[str, Any]] | None]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule.get("ports", [{"port": "*"}]):
            by_port.setdefault(port["port"], []).append(rule.get("from"))
    return by_port
