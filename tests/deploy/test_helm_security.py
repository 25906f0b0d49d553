"""Hardening and network isolation of everything the chart runs: every container bounded
and unprivileged, credentials only where they are used, Redis and vLLM requiring theirs,
and each port reachable only by the peers that need it."""

from __future__ import annotations

import base64
from typing import Any

import helm_python as helm
import yaml
from chart_support import (
    CHART,
    SECRET_REFERENCE,
    Manifest,
    Render,
    component_of,
    containers,
    env_of,
    find,
    ingress_by_port,
    pod_spec,
    workloads,
)


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
        assert component_of(workload) in protected, component_of(workload)

    open_to_all = [
        p["metadata"]["name"] for p in policies for r in p["spec"]["ingress"] if "from" not in r
    ]
    assert open_to_all == ["cs-composer-stack-gateway-ingress"]

    vllm_rules = _components_allowed(protected["vllm-fast"])
    assert protected["vllm-fast"] is protected["vllm-standard"]
    assert {"gateway", "trainer"} in vllm_rules
    assert all(r is None or r == {"gateway", "trainer"} for r in vllm_rules)


def test_each_secret_reaches_only_the_process_that_uses_it(manifests: list[Manifest]) -> None:
    holders: dict[str, set[str]] = {}
    for workload in workloads(manifests):
        for container in containers(workload):
            for entry in container.get("env", []):
                if "secretKeyRef" in entry.get("valueFrom", {}):
                    holders.setdefault(entry["name"], set()).add(component_of(workload))
    assert holders["CSTACK_ADMIN_TOKEN"] == {"gateway"}
    assert holders["CSTACK_STRIPE_API_KEY"] == {"billing-worker"}
    assert holders["CSTACK_STRIPE_WEBHOOK_SECRET"] == {"gateway"}
    # Beat only enqueues: at most Redis's URL or password.
    beat_secrets = {name for name, who in holders.items() if "billing-beat" in who}
    assert beat_secrets <= {"CSTACK_REDIS_URL", "REDIS_PASSWORD"}
    # vLLM's key: the engines that require it, the gateway and the trainer that send it.
    assert holders["CSTACK_UPSTREAM_API_KEY"] == {"gateway"}
    vllm = {"vllm-standard", "vllm-fast"}
    assert vllm <= holders["VLLM_API_KEY"] <= vllm | {"trainer"}


#: Every workload that talks to Redis, rendered with the in-chart Valkey.
EVERYTHING_ON: dict[str, Any] = {
    **SECRET_REFERENCE,
    "rollouts": {"enabled": True},
    "trainer": {"enabled": True},
}


def _secret_ref(entry: dict[str, Any]) -> dict[str, str]:
    ref: dict[str, str] = entry["valueFrom"]["secretKeyRef"]
    return ref


def test_no_credential_has_a_default(chart: helm.Chart) -> None:
    """No password, token or key in the chart's defaults (names of Secrets and of keys
    in them aside), and none in the values file as text."""

    def leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
        if isinstance(node, dict):
            return [leaf for key, value in node.items() for leaf in leaves(value, (*path, key))]
        return [(path, node)]

    credential = ("password", "token", "apikey", "secret")
    for path, value in leaves(chart.values):
        name = path[-1].lower()
        if "keys" in path or name.endswith(("existingsecret", "casecret")):
            continue
        if isinstance(value, str) and any(word in name for word in credential):
            assert value == "", f"{'.'.join(path)} has a default"
    text = (CHART / "values.yaml").read_text()
    assert "requirepass" not in text


def test_in_chart_redis_requires_the_password_every_client_sends(render: Render) -> None:
    manifests = render(EVERYTHING_ON)
    valkey = containers(find(manifests, "StatefulSet", "-redis"))[0]
    args = valkey["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    server_ref = _secret_ref(env_of(valkey)["REDIS_PASSWORD"])
    assert server_ref["key"] == "redis-password"
    # The readiness probe authenticates too (without, the server answers NOAUTH).
    assert env_of(valkey)["REDISCLI_AUTH"]["value"] == "$(REDIS_PASSWORD)"

    clients = set()
    for workload in workloads(manifests):
        for container in containers(workload):
            names = [entry["name"] for entry in container.get("env", [])]
            if "CSTACK_REDIS_URL" not in names:
                continue
            clients.add(component_of(workload))
            env = env_of(container)
            url = env["CSTACK_REDIS_URL"]["value"]
            assert url.startswith("redis://:$(REDIS_PASSWORD)@"), component_of(workload)
            assert _secret_ref(env["REDIS_PASSWORD"]) == server_ref
            # Kubernetes expands $(VAR) only from variables defined before it.
            assert names.index("REDIS_PASSWORD") < names.index("CSTACK_REDIS_URL")
    assert clients == {"gateway", "billing-worker", "billing-beat", "rollouts", "trainer"}


def test_an_external_redis_url_and_its_ca_come_from_secrets(render: Render) -> None:
    """TLS: a rediss:// URL from the external Secret, and the CA mounted where the URL's
    ssl_ca_certs points."""
    manifests = render(
        {
            **EVERYTHING_ON,
            "rollouts": {"enabled": False},  # its template is maintained separately
            "redis": {
                "enabled": False,
                "external": {"existingSecret": "redis-url"},
                "tls": {"caSecret": "redis-ca"},
            },
        }
    )
    assert not [m for m in workloads(manifests) if component_of(m) == "redis"]
    for workload in workloads(manifests):
        for container in containers(workload):
            env = env_of(container)
            if "CSTACK_REDIS_URL" not in env:
                continue
            assert _secret_ref(env["CSTACK_REDIS_URL"]) == {"name": "redis-url", "key": "redis-url"}
            assert "REDIS_PASSWORD" not in env
            mount = next(m for m in container["volumeMounts"] if m["name"] == "redis-ca")
            assert mount == {
                "name": "redis-ca",
                "mountPath": "/etc/cstack/redis-ca",
                "readOnly": True,
            }
            volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == "redis-ca")
            assert volume["secret"]["secretName"] == "redis-ca"


def test_internal_credentials_are_generated_when_not_given(render: Render) -> None:
    given = {
        "adminToken": "admin-from-install",
        "stripeApiKey": "sk_test_install",
        "stripeWebhookSecret": "whsec_install",
        "postgresPassword": "pg-install",
    }
    secret = find(render({"secrets": given}), "Secret", "-secrets")
    generated = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert set(generated) == {"redis-password", "vllm-api-key"}
    for value in generated.values():
        assert len(value) == 48 and value.isalnum()  # URL-safe: it goes into the Redis URL
    # Given, they are used as given.
    rotated = {**given, "redisPassword": "rotated-redis", "vllmApiKey": "rotated-vllm"}
    secret = find(render({"secrets": rotated}), "Secret", "-secrets")
    assert "data" not in secret
    assert secret["stringData"]["redis-password"] == "rotated-redis"
    assert secret["stringData"]["vllm-api-key"] == "rotated-vllm"


def test_vllm_requires_an_api_key_that_the_gateway_and_trainer_send(
    production_manifests: list[Manifest],
) -> None:
    refs = []
    for tier in ("standard", "fast"):
        engine = containers(find(production_manifests, "Deployment", f"-vllm-{tier}"))[0]
        refs.append(_secret_ref(env_of(engine)["VLLM_API_KEY"]))
        # From the environment, never the command line (`ps` shows that to everyone).
        assert "--api-key" not in engine["args"]
    gateway = env_of(containers(find(production_manifests, "Deployment", "-gateway"))[0])
    refs.append(_secret_ref(gateway["CSTACK_UPSTREAM_API_KEY"]))
    trainer = env_of(containers(find(production_manifests, "Job", "-trainer"))[0])
    refs.append(_secret_ref(trainer["VLLM_API_KEY"]))
    assert all(ref == refs[0] for ref in refs) and refs[0]["key"] == "vllm-api-key"


def test_vllm_engine_port_admits_only_the_gateway_and_trainer(
    chart: helm.Chart, production_manifests: list[Manifest], production_values: dict[str, Any]
) -> None:
    """The engine port serves routes vLLM's key does not guard (with the trainer on, the
    dev endpoints that reload weights): the monitoring namespace reaches the metrics relay
    beside it, and that relay serves GET /metrics only (tests/security/test_network.py)."""
    values = chart.merge_values(production_values)
    metrics_from = values["networkPolicy"]["metricsFrom"]
    policy = find(production_manifests, "NetworkPolicy", "-vllm-ingress")
    by_port = ingress_by_port(policy)
    assert set(by_port) == {"http", "metrics"}
    assert None not in by_port["http"]  # never open to any peer
    engine_peers = [peer for peers in by_port["http"] for peer in peers or []]
    assert [peer["podSelector"]["matchExpressions"][0]["values"] for peer in engine_peers] == [
        ["gateway", "trainer"]
    ]
    assert by_port["metrics"] == [metrics_from]
    for tier in ("standard", "fast"):
        deployment = find(production_manifests, "Deployment", f"-vllm-{tier}")
        engine, relay = containers(deployment)
        assert [p["name"] for p in engine["ports"]] == ["http"]
        assert [p["name"] for p in relay["ports"]] == ["metrics"]
        assert relay["command"] == ["python", "-m", "serving.metrics_relay"]
        port = values["vllm"]["port"]
        assert relay["args"] == [
            str(values["vllm"]["metricsPort"]),
            f"http://127.0.0.1:{port}/metrics",
        ]


def test_gateway_internal_port_admits_only_monitoring_and_admins(
    chart: helm.Chart, render: Render, production_values: dict[str, Any]
) -> None:
    admins = [{"podSelector": {"matchLabels": {"app": "admin-console"}}}]
    values = {
        **production_values,
        "networkPolicy": {**production_values["networkPolicy"], "adminFrom": admins},
    }
    manifests = render(values)
    merged = chart.merge_values(values)
    gateway = containers(find(manifests, "Deployment", "-gateway"))[0]
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {
        "http": merged["gateway"]["port"],
        "internal": merged["gateway"]["internalPort"],
    }
    assert env_of(gateway)["CSTACK_INTERNAL_PORT"]["value"] == str(ports["internal"])

    by_port = ingress_by_port(find(manifests, "NetworkPolicy", "-gateway-ingress"))
    assert by_port["internal"] == [merged["networkPolicy"]["metricsFrom"] + admins]
    assert by_port["http"] == [None]  # the public API: anyone
    # The public Service exposes the public listener only; the internal one has its own.
    public = find(manifests, "Service", "-gateway")
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["http"]
    internal = find(manifests, "Service", "-gateway-internal")
    assert internal["spec"]["type"] == "ClusterIP"
    assert [p["targetPort"] for p in internal["spec"]["ports"]] == ["internal"]
    # Prometheus scrapes the internal port, and no API port of anything.
    monitor = find(manifests, "ServiceMonitor", "composer-stack")
    scraped = {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]}
    assert "internal" in scraped and "http" not in scraped

    # Without metricsFrom or adminFrom, nothing reaches the internal port.
    default = ingress_by_port(find(render(SECRET_REFERENCE), "NetworkPolicy", "-gateway-ingress"))
    assert set(default) == {"http"}


def test_the_kubernetes_prometheus_config_scrapes_no_api_port() -> None:
    config = yaml.safe_load(
        (CHART.parents[1] / "deploy" / "prometheus" / "prometheus.yml").read_text()
    )
    for job in config["scrape_configs"]:
        keep = next(
            rule for rule in job["relabel_configs"]
            if rule["source_labels"] == ["__meta_kubernetes_endpoint_port_name"]
        )  # fmt: skip
        assert keep["action"] == "keep"
        assert keep["regex"] == "internal|metrics(-[0-9]+)?"
