"""The Helm chart, rendered and linted by Helm's own engine, validated against Kubernetes."""

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
    pod_spec,
    workloads,
)
from pydantic_settings import BaseSettings

from billing.settings import BillingSettings
from gateway import GatewaySettings
from serving import TIERS, VllmServer, load_variants
from training.settings import TrainingSettings

KUBE_VERSION = "1.30.0"
#: Kinds from the Prometheus operator's CRDs: no Kubernetes schema exists for them, so
#: their content is checked by the tests below (promtool for the rules) instead.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}

# Every copy the chart ships next to the file it copies: Helm cannot read files outside
# the chart directory, so these stay byte-identical instead of drifting.
CHART_COPIES = [
    ("files/variants.yaml", "serving/variants.yaml"),
    ("files/pricebook.yaml", "billing/pricebook.yaml"),
    ("files/prometheus/alerts.yaml", "deploy/prometheus/alerts.yaml"),
    *[
        (f"files/dashboards/{path.name}", f"deploy/grafana/{path.name}")
        for path in sorted((REPO / "deploy" / "grafana").glob("*.json"))
    ],
]


@pytest.fixture(params=["default", "production"])
def manifests(
    request: pytest.FixtureRequest,
    default_manifests: list[Manifest],
    production_manifests: list[Manifest],
) -> list[Manifest]:
    return default_manifests if request.param == "default" else production_manifests


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


@pytest.mark.parametrize("file_in_chart, source", CHART_COPIES)
def test_chart_copies_are_byte_identical_to_their_sources(file_in_chart: str, source: str) -> None:
    assert (CHART / file_in_chart).read_bytes() == (REPO / source).read_bytes(), (
        f"{file_in_chart} drifted from {source}: cp {source} helm/composer-stack/{file_in_chart}"
    )


def test_chart_ships_every_dashboard() -> None:
    shipped = {p.name for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert shipped == {p.name for p in (REPO / "deploy" / "grafana").glob("*.json")}


def _flag_pairs(flags: list[str]) -> list[tuple[str, str | None]]:
    """vLLM flags grouped as (flag, value or None for a switch)."""
    pairs: list[tuple[str, str | None]] = []
    for token in flags:
        if token.startswith("--"):
            pairs.append((token, None))
        else:
            assert pairs and pairs[-1][1] is None, f"value {token!r} without a flag"
            pairs[-1] = (pairs[-1][0], token)
    return pairs


@pytest.mark.parametrize("tier", TIERS)
def test_vllm_runs_exactly_what_serving_would_launch(
    default_manifests: list[Manifest], chart: helm.Chart, tier: str
) -> None:
    book = load_variants(REPO / "serving" / "variants.yaml")
    values = chart.values
    container = containers(find(default_manifests, "Deployment", f"-vllm-{tier}"))[0]
    rendered = [*container["command"], *container["args"]]

    launcher = VllmServer(
        model_dir=Path(values["model"]["path"]),
        port=values["vllm"]["port"],
        served_model_name=book.served_model_name,
        host="0.0.0.0",
    ).command
    # The launcher runs sys.executable; the upstream image's interpreter is python3.
    assert rendered[0] == "python3"
    assert rendered[1 : len(launcher)] == launcher[1:]

    engine_flags = _flag_pairs(rendered[len(launcher) :])
    # cli_args renders one flag (with its value) per engine argument, in the file's
    # order; Helm iterates maps in key order, so the same flags arrive sorted by key.
    engine_args = book.engine_args(tier, "gpu")
    by_key = dict(zip(engine_args, _flag_pairs(book.cli_args(tier, "gpu")), strict=True))
    assert engine_flags == [by_key[key] for key in sorted(by_key)]

    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == book.engine_args(tier, "gpu").get("tensor-parallel-size", 1)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    probe = container["readinessProbe"]["httpGet"]
    assert probe == {"path": "/health", "port": "http"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {
        v["name"]: v
        for v in pod_spec(find(default_manifests, "Deployment", f"-vllm-{tier}"))["volumes"]
    }
    assert values["model"]["path"].startswith(mounts["model-cache"]["mountPath"])
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"].endswith("-model-cache")


def test_gateway_and_trainer_reach_each_tier_pool(production_manifests: list[Manifest]) -> None:
    pools = {}
    for tier in TIERS:
        service = find(production_manifests, "Service", f"-vllm-{tier}")
        pools[tier] = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    gateway_env = env_of(containers(find(production_manifests, "Deployment", "-gateway"))[0])
    for tier in TIERS:
        assert gateway_env[f"CSTACK_{tier.upper()}_UPSTREAM_URLS"]["value"] == pools[tier]
    trainer_env = env_of(containers(find(production_manifests, "Job", "-trainer"))[0])
    assert sorted(json.loads(trainer_env["CSTACK_RL_ENGINE_URLS"]["value"])) == sorted(
        pools.values()
    )


@pytest.mark.parametrize(
    ("kind", "workload", "settings"),
    [
        ("Deployment", "-gateway", (GatewaySettings, BillingSettings)),
        ("Deployment", "-billing-worker", (BillingSettings,)),
        ("Deployment", "-billing-beat", (BillingSettings,)),
        ("Deployment", "-rollouts", (TrainingSettings,)),
        ("Job", "-trainer", (TrainingSettings,)),
    ],
)
def test_env_names_are_settings_fields(
    production_manifests: list[Manifest],
    kind: str,
    workload: str,
    settings: tuple[type[BaseSettings], ...],
) -> None:
    """A misspelt CSTACK_ variable is silently ignored by pydantic-settings: catch it here.
    (The gateway process also runs billing's meter, which reads billing's settings.)"""
    container = containers(find(production_manifests, kind, workload))[0]
    fields = {f"CSTACK_{name.upper()}" for model in settings for name in model.model_fields}
    names = {name for name in env_of(container) if name.startswith("CSTACK_")}
    assert names and names <= fields, sorted(names - fields)


def test_pricebook_is_mounted_where_billing_reads_it(default_manifests: list[Manifest]) -> None:
    configmap = find(default_manifests, "ConfigMap", "-pricebook")
    assert configmap["data"]["pricebook.yaml"] == (REPO / "billing" / "pricebook.yaml").read_text()
    for workload in ("-gateway", "-billing-worker", "-billing-beat"):
        manifest = find(default_manifests, "Deployment", workload)
        container = containers(manifest)[0]
        path = Path(env_of(container)["CSTACK_PRICEBOOK_PATH"]["value"])
        mount = next(m for m in container["volumeMounts"] if m["name"] == "pricebook")
        assert path == Path(mount["mountPath"]) / "pricebook.yaml"
        volume = next(v for v in pod_spec(manifest)["volumes"] if v["name"] == "pricebook")
        assert volume["configMap"]["name"] == configmap["metadata"]["name"]


def test_processes_run_the_cstack_commands(production_manifests: list[Manifest]) -> None:
    def argv(kind: str, suffix: str) -> list[str]:
        container = containers(find(production_manifests, kind, suffix))[0]
        return [*container["command"], *container["args"]]

    assert argv("Deployment", "-gateway")[:2] == ["cstack", "gateway"]
    assert argv("Deployment", "-billing-worker")[:3] == ["cstack", "worker", "billing"]
    assert argv("Deployment", "-billing-beat") == ["cstack", "beat"]
    assert argv("Deployment", "-rollouts")[:3] == ["cstack", "worker", "rollouts"]


def test_trainer_is_an_indexed_job_running_torchrun_across_pods(
    chart: helm.Chart, production_manifests: list[Manifest], production_values: dict[str, Any]
) -> None:
    job = find(production_manifests, "Job", "-trainer")
    values = chart.merge_values(production_values)
    trainer = values["trainer"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == trainer["nodes"]
    service = find(production_manifests, "Service", "-trainer")
    assert service["spec"]["clusterIP"] == "None"
    assert pod_spec(job)["subdomain"] == service["metadata"]["name"]
    container = containers(job)[0]
    # `cstack train` starts torchrun itself, rendezvousing on pod 0 of the Job.
    assert container["command"] == ["cstack", "train"]
    pod_zero = f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert container["args"] == [
        f"--model={values['model']['path']}",
        f"--nnodes={trainer['nodes']}",
        f"--nproc={trainer['gpusPerNode']}",
        f"--rdzv-endpoint={pod_zero}:{trainer['rendezvousPort']}",
        *trainer["args"],
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == trainer["gpusPerNode"]
    metrics_port = int(env_of(container)["CSTACK_TRAINER_METRICS_PORT"]["value"])
    assert {"name": "metrics", "containerPort": metrics_port} in container["ports"]


def test_every_container_is_hardened_and_bounded(manifests: list[Manifest]) -> None:
    for workload in workloads(manifests):
        name = workload["metadata"]["name"]
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["automountServiceAccountToken"] is False, name
        for container in containers(workload):
            resources = container["resources"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[bound]), f"{name}: {bound}"
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name


def _components_allowed(policy: Manifest) -> list[set[str] | None]:
    """Per ingress rule: the release components it admits, or None for other peers."""
    allowed: list[set[str] | None] = []
    for rule in policy["spec"]["ingress"]:
        peers = rule.get("from")
        if peers is None:
            allowed.append(None)
            continue
        for peer in peers:
            selector = peer.get("podSelector")
            if selector is None or "namespaceSelector" in peer:
                allowed.append(None)
            else:
                allowed.append(set(selector["matchExpressions"][0]["values"]))
    return allowed


def test_network_policies_expose_only_the_gateway(manifests: list[Manifest]) -> None:
    policies = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    protected: dict[str, Manifest] = {}
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for component in policy["spec"]["podSelector"]["matchExpressions"][0]["values"]:
            protected[component] = policy
    # Every pod of the release is covered by exactly one policy.
    for workload in workloads(manifests):
        component = workload["spec"]["template"]["metadata"]["labels"][
            "app.kubernetes.io/component"
        ]
        assert component in protected, component

    open_to_all = [
        p["metadata"]["name"] for p in policies for r in p["spec"]["ingress"] if "from" not in r
    ]
    assert open_to_all == ["cs-composer-stack-gateway-ingress"]

    vllm_rules = _components_allowed(protected["vllm-fast"])
    assert protected["vllm-fast"] is protected["vllm-standard"]
    assert {"gateway", "trainer"} in vllm_rules
    assert all(r is None or r == {"gateway", "trainer"} for r in vllm_rules)


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
        "gateway",
        "vllm-standard",
        "vllm-fast",
        "billing-worker",
        "billing-beat",
        "rollouts",
        "trainer",
    }


def _cli_options(argv: list[str]) -> set[str]:
    """The option names of the `cstack` (sub)command that ``argv`` names."""
    import typer

    from deploy.cli import app

    command: Any = typer.main.get_command(app)
    for word in argv:
        command = getattr(command, "commands", {}).get(word)
        assert command is not None, f"`cstack {' '.join(argv)}` does not exist"
    return {opt for param in command.params for opt in param.opts}


def test_chart_runs_cstack_commands_that_exist(production_manifests: list[Manifest]) -> None:
    for manifest in workloads(production_manifests):
        for container in containers(manifest):
            if container["command"][0] != "cstack":
                continue
            argv = [*container["command"][1:], *container["args"]]
            words = [arg for arg in argv if not arg.startswith("-")]
            subcommand = words[: 2 if words[0] == "worker" else 1]
            options = _cli_options(subcommand)
            passed = {arg.split("=")[0] for arg in argv if arg.startswith("--")}
            assert passed <= options, f"cstack {' '.join(subcommand)}: {passed - options}"


def test_vllm_dev_endpoints_only_with_the_trainer(
    default_manifests: list[Manifest], production_manifests: list[Manifest]
) -> None:
    """Weight sync needs vLLM's dev endpoints; without a trainer they stay off."""
    for manifests, expected in ((default_manifests, None), (production_manifests, "1")):
        for tier in TIERS:
            env = env_of(containers(find(manifests, "Deployment", f"-vllm-{tier}"))[0])
            assert env.get("VLLM_SERVER_DEV_MODE", {}).get("value") == expected
