"""Hardening and network isolation of everything the chart runs."""

from __future__ import annotations

from chart_support import (
    Manifest,
    component_of,
    containers,
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
    # Beat only enqueues: at most the Redis URL (which may carry a password).
    beat_secrets = {name for name, who in holders.items() if "billing-beat" in who}
    assert beat_secrets <= {"CSTACK_REDIS_URL"}
