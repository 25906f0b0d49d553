"""The Helm chart, rendered and linted by Helm's own engine, validated against Kubernetes;
its values schema and secrets; the files it links to and the monitoring objects it ships."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chart_support import (
    CHART,
    REPO,
    SECRET_REFERENCE,
    Manifest,
    Render,
    containers,
    env_of,
    find,
)

KUBE_VERSION = "1.30.0"
#: Kinds from the Prometheus operator's CRDs: no Kubernetes schema exists for them, so
#: their content is checked by the tests below (promtool for the rules) instead.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}

# Helm cannot read files outside the chart directory, so the chart's files/ are symlinks
# to the repository's single copy of each (Helm follows them when rendering and packaging).
CHART_LINKS = [
    ("files/variants.yaml", "serving/variants.yaml"),
    ("files/pricebook.yaml", "billing/prices/pricebook.yaml"),
    ("files/prometheus/alerts.yaml", "deploy/prometheus/alerts.yaml"),
    ("files/dashboards", "deploy/grafana"),
]


def test_every_manifest_validates_against_kubernetes_schemas(manifests: list[Manifest]) -> None:
    unvalidated = set()
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unvalidated.add(manifest["kind"])
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']}: {path}: {exc.message}")
    assert unvalidated <= OPERATOR_KINDS


def test_default_values_deploy_the_serving_and_billing_stack(
    default_manifests: list[Manifest],
) -> None:
    kinds = {(m["kind"], m["metadata"]["name"]) for m in default_manifests}
    for kind, name in [
        ("Deployment", "cs-composer-stack-gateway"),
        ("Service", "cs-composer-stack-gateway"),
        ("HorizontalPodAutoscaler", "cs-composer-stack-gateway"),
        ("PodDisruptionBudget", "cs-composer-stack-gateway"),
        ("Deployment", "cs-composer-stack-vllm-standard"),
        ("Deployment", "cs-composer-stack-vllm-fast"),
        ("PersistentVolumeClaim", "cs-composer-stack-model-cache"),
        ("StatefulSet", "cs-composer-stack-redis"),
        ("StatefulSet", "cs-composer-stack-postgresql"),
        ("Deployment", "cs-composer-stack-billing-worker"),
        ("Deployment", "cs-composer-stack-billing-beat"),
        ("ConfigMap", "cs-composer-stack-pricebook"),
    ]:
        assert (kind, name) in kinds
    # The secrets are referenced, not created, and nothing secret is in the render.
    assert not [m for m in default_manifests if m["kind"] == "Secret"]


def test_production_values_add_training_and_monitoring(
    production_manifests: list[Manifest],
) -> None:
    kinds = {m["kind"] for m in production_manifests}
    assert {"Job", "ServiceMonitor", "PrometheusRule"} <= kinds
    find(production_manifests, "Deployment", "-rollouts")
    # Redis and PostgreSQL are external there.
    assert "StatefulSet" not in kinds


@pytest.mark.parametrize("values_name", ["default", "production"])
def test_chart_lints_clean(values_name: str, production_values: dict[str, Any]) -> None:
    values = SECRET_REFERENCE if values_name == "default" else production_values
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    # Severity 1 is informational (e.g. "icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_secrets_have_no_defaults_and_are_required(chart: helm.Chart) -> None:
    secrets = chart.values["secrets"]
    for key in ("adminToken", "stripeApiKey", "stripeWebhookSecret", "postgresPassword"):
        assert secrets[key] == ""
    assert secrets["existingSecret"] == ""
    with pytest.raises(helm.HelmRenderError) as refused:
        chart.render({}, name="cs", namespace="composer")
    message = str(refused.value)
    assert "secrets.adminToken is required" in message
    assert "secrets.existingSecret" in message


def test_secret_values_given_at_install_create_the_secret(render: Render) -> None:
    given = {
        "adminToken": "admin-from-install",
        "stripeApiKey": "sk_test_install",
        "stripeWebhookSecret": "whsec_install",
        "postgresPassword": "pg-install",
    }
    manifests = render({"secrets": given})
    secret = find(manifests, "Secret", "-secrets")
    assert set(secret["stringData"].values()) == set(given.values())
    gateway_env = env_of(containers(find(manifests, "Deployment", "-gateway"))[0])
    ref = gateway_env["CSTACK_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "admin-token"}
    # Secret values never appear outside the Secret.
    others = json.dumps([m for m in manifests if m["kind"] != "Secret"])
    assert not [value for value in given.values() if value in others]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"gateway": {"replicas": 0}}, "/gateway/replicas"),
        ({"gateway": {"autoscaling": {"maxReplicas": "ten"}}}, "/gateway/autoscaling/maxReplicas"),
        ({"vllm": {"tiers": {"fast": {"gpus": -1}}}}, "/vllm/tiers/fast/gpus"),
        ({"vllm": {"tiers": {"turbo": {}}}}, "/vllm/tiers"),
        (
            {"redis": {"resources": {"limits": {"memory": "lots"}}}},
            "/redis/resources/limits/memory",
        ),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
        ({"gateway": {"env": {"REDIS_URL": "redis://x"}}}, "/gateway/env"),
        ({"model": {"path": "relative/dir"}}, "/model/path"),
        ({"gatewy": {}}, "'gatewy' not allowed"),
    ],
)
def test_values_schema_rejects_bad_values_with_a_message(
    chart: helm.Chart, values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as rejected:
        chart.validate_schema({**SECRET_REFERENCE, **values})
    assert where in str(rejected.value)
    # Rendering refuses the same values before any template runs.
    with pytest.raises(helm.HelmValuesError):
        chart.render({**SECRET_REFERENCE, **values}, name="cs")


def test_template_checks_name_the_problem(chart: helm.Chart) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"vllm": {"profile": "tpu"}}, 'no profile "tpu" (known: cpu, gpu)'),
        ({"redis": {"enabled": False}}, "redis.external.existingSecret is required"),
        ({"gateway": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "exceeds maxReplicas"),
    ]
    for values, message in cases:
        with pytest.raises(helm.HelmRenderError) as refused:
            chart.render({**SECRET_REFERENCE, **values}, name="cs")
        assert message in str(refused.value)


@pytest.mark.parametrize(("file_in_chart", "source"), CHART_LINKS)
def test_chart_files_are_the_repositorys_own(file_in_chart: str, source: str) -> None:
    path = CHART / file_in_chart
    assert path.is_symlink(), f"{file_in_chart} must link to {source}, not copy it"
    assert path.resolve() == (REPO / source).resolve()


def test_monitoring_objects_match_deploy_sources(production_manifests: list[Manifest]) -> None:
    rule = find(production_manifests, "PrometheusRule", "composer-stack")
    source = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yaml").read_text())
    assert rule["spec"] == source
    dashboards = {
        name: json.loads(text)
        for m in production_manifests
        if m["kind"] == "ConfigMap" and "-dashboard-" in m["metadata"]["name"]
        for name, text in m["data"].items()
    }
    expected = {
        p.name: json.loads(p.read_text()) for p in (REPO / "deploy" / "grafana").glob("*.json")
    }
    assert dashboards == expected

    monitor = find(production_manifests, "ServiceMonitor", "composer-stack")
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped_ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    selected = [
        s
        for s in production_manifests
        if s["kind"] == "Service"
        and selector.items() <= s["metadata"]["labels"].items()
        and {p["name"] for p in s["spec"]["ports"]} & scraped_ports
    ]
    names = {s["metadata"]["name"].removeprefix("cs-composer-stack-") for s in selected}
    assert names == {
        "gateway-internal",
        "vllm-standard",
        "vllm-fast",
        "billing-worker",
        "rollouts",
        "trainer",
    }


def test_packaged_chart_carries_the_linked_files(
    chart: helm.Chart, production_values: dict[str, Any], tmp_path: Path
) -> None:
    """`helm package` stores the linked files' contents: the archive renders the same."""
    archive = helm.package(str(CHART), destination=str(tmp_path))
    with helm.Chart.load(archive) as packaged:
        for values in (SECRET_REFERENCE, production_values):
            expected = chart.render(values, name="cs", namespace="composer")
            assert packaged.render(values, name="cs", namespace="composer") == expected
