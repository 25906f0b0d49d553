"""What the chart's workloads run: vLLM exactly as serving launches it, the cstack commands
and settings names that exist, the price book where billing reads it, the trainer Job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from chart_support import (
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
from gateway.settings import GatewaySettings
from serving.launcher import VllmServer
from serving.settings import ServingSettings
from serving.variants import load_variants
from serving.vocabulary import TIERS
from training.settings import TrainingSettings


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
    # The trainer pushes weights to every replica: each tier's headless Service selects the
    # same pods as the pool's Service and resolves to each of them.
    trainer_env = env_of(containers(find(production_manifests, "Job", "-trainer"))[0])
    replicas = {}
    for tier in TIERS:
        pool = find(production_manifests, "Service", f"-vllm-{tier}")
        headless = find(production_manifests, "Service", f"-vllm-{tier}-replicas")
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["selector"] == pool["spec"]["selector"]
        assert [(p["port"], p["targetPort"]) for p in headless["spec"]["ports"]] == [
            (p["port"], p["targetPort"]) for p in pool["spec"]["ports"]
        ]
        port = headless["spec"]["ports"][0]["port"]
        replicas[tier] = f"http://{headless['metadata']['name']}:{port}"
    assert sorted(json.loads(trainer_env["CSTACK_RL_ENGINE_URLS"]["value"])) == sorted(
        replicas.values()
    )


@pytest.mark.parametrize("tier", TIERS)
def test_vllm_takes_live_weight_pushes_only_when_the_trainer_runs(
    default_manifests: list[Manifest], production_manifests: list[Manifest], tier: str
) -> None:
    """With the trainer on, each engine gets the variants file's weight_sync section, as
    `cstack serve --weight-sync` does: the dev endpoints and the reload extension (which
    the vLLM image ships)."""
    sync = load_variants(REPO / "serving" / "variants.yaml").weight_sync
    for manifests, trainer in ((default_manifests, False), (production_manifests, True)):
        container = containers(find(manifests, "Deployment", f"-vllm-{tier}"))[0]
        flags = _flag_pairs(container["args"])
        env = env_of(container)
        for key, value in sync.engine_args.items():
            assert ((f"--{key}", str(value)) in flags) is trainer
        for name, value in sync.env.items():
            assert (env.get(name, {}).get("value") == value) is trainer


def test_a_cpu_engine_taking_weight_pushes_gets_the_weight_sync_cpu_arguments(
    render: Render, production_values: dict[str, Any]
) -> None:
    """The variants file's weight_sync profile for cpu (the reference CPU MLA backend, which
    an in-place reload can write) reaches a cpu engine, as `cstack serve --weight-sync`
    gives it; a gpu engine does not get it."""
    extra = load_variants(REPO / "serving" / "variants.yaml").weight_sync.profiles["cpu"]
    assert extra  # the section this test is about
    for profile in ("cpu", "gpu"):
        values = {**production_values, "vllm": {**production_values["vllm"], "profile": profile}}
        container = containers(find(render(values), "Deployment", "-vllm-fast"))[0]
        flags = _flag_pairs(container["args"])
        for key, value in extra.items():
            assert ((f"--{key}", str(value)) in flags) is (profile == "cpu")


def test_gateway_drains_within_its_pods_termination_grace(render: Render) -> None:
    for grace in (50, 300):
        manifests = render({**SECRET_REFERENCE, "gateway": {"shutdownGraceSeconds": grace}})
        gateway = find(manifests, "Deployment", "-gateway")
        assert pod_spec(gateway)["terminationGracePeriodSeconds"] == grace + 10
        env = env_of(containers(gateway)[0])
        assert (
            GatewaySettings(
                shutdown_grace_s=env["CSTACK_SHUTDOWN_GRACE_S"]["value"]
            ).shutdown_grace_s
            == grace
        )


def test_gateway_request_duration_and_redis_outage_admission_reach_its_settings(
    render: Render,
) -> None:
    values = {
        "maxRequestDurationSeconds": 3600,
        "redisDown": {"admission": "fail_closed", "allowanceNanoUsd": 25_000_000_000,
                      "allowanceRequests": 1000},
    }  # fmt: skip
    cases = [
        ({}, (1800, "local_allowance", 2_000_000_000, 500)),
        (values, (3600, "fail_closed", 25_000_000_000, 1000)),
    ]
    for gateway_values, expected in cases:
        manifests = render({**SECRET_REFERENCE, "gateway": gateway_values})
        env = env_of(containers(find(manifests, "Deployment", "-gateway"))[0])
        plain = {name: entry["value"] for name, entry in env.items() if "value" in entry}
        gateway = GatewaySettings.model_validate(
            {"max_request_duration_s": plain["CSTACK_MAX_REQUEST_DURATION_S"]}
        )
        billing = BillingSettings.model_validate(
            {
                "admission_when_redis_down": plain["CSTACK_ADMISSION_WHEN_REDIS_DOWN"],
                "redis_down_allowance_nano_usd": plain["CSTACK_REDIS_DOWN_ALLOWANCE_NANO_USD"],
                "redis_down_allowance_requests": plain["CSTACK_REDIS_DOWN_ALLOWANCE_REQUESTS"],
            }
        )
        assert (
            gateway.max_request_duration_s,
            billing.admission_when_redis_down,
            billing.redis_down_allowance_nano_usd,
            billing.redis_down_allowance_requests,
        ) == expected


def test_gateway_runs_a_worker_per_core_of_its_pod(render: Render) -> None:
    """CSTACK_GATEWAY_WORKERS: the container's CPU limit in whole cores (downward API,
    rounded up), else its request, else 1; or gateway.workers as given."""

    def workers_env(gateway_values: dict[str, Any]) -> dict[str, Any]:
        manifests = render({**SECRET_REFERENCE, "gateway": gateway_values})
        return env_of(containers(find(manifests, "Deployment", "-gateway"))[0])[
            "CSTACK_GATEWAY_WORKERS"
        ]

    def from_pod(resource: str) -> dict[str, Any]:
        field = {"containerName": "gateway", "resource": resource, "divisor": "1"}
        return {"name": "CSTACK_GATEWAY_WORKERS", "valueFrom": {"resourceFieldRef": field}}

    assert workers_env({}) == from_pod("limits.cpu")  # the default resources have a limit
    # Helm merges values over the defaults; null removes a default.
    only_request = {"requests": {"cpu": "1500m"}, "limits": {"cpu": None}}
    assert workers_env({"resources": only_request}) == from_pod("requests.cpu")
    no_cpu = {"requests": {"cpu": None}, "limits": {"cpu": None}}
    assert workers_env({"resources": no_cpu})["value"] == "1"
    given = workers_env({"workers": 3})
    assert given == {"name": "CSTACK_GATEWAY_WORKERS", "value": "3"}
    assert GatewaySettings(gateway_workers=given["value"]).gateway_workers == 3


@pytest.mark.parametrize(
    ("kind", "workload", "settings"),
    [
        ("Deployment", "-gateway", (GatewaySettings, BillingSettings, ServingSettings)),
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
    (The gateway process also runs billing's meter, which reads billing's settings, and
    reads serving's variants and profile to size engine admission.)"""
    container = containers(find(production_manifests, kind, workload))[0]
    fields = {f"CSTACK_{name.upper()}" for model in settings for name in model.model_fields}
    names = {name for name in env_of(container) if name.startswith("CSTACK_")}
    assert names and names <= fields, sorted(names - fields)


def test_pricebook_is_mounted_where_billing_reads_it(default_manifests: list[Manifest]) -> None:
    configmap = find(default_manifests, "ConfigMap", "-pricebook")
    assert (
        configmap["data"]["pricebook.yaml"]
        == (REPO / "billing" / "prices" / "pricebook.yaml").read_text()
    )
    for workload in ("-gateway", "-billing-worker"):
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


# Parses argv with vLLM's own server argument parser, in a child process so vLLM's import
# side effects stay out of the test session; prints the engine arguments it produced.
_VLLM_PARSE = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

for argv in json.loads(sys.stdin.read()):
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    engine = AsyncEngineArgs.from_cli_args(parsed)
    print(json.dumps({"model": engine.model, "port": parsed.port,
                      "tensor_parallel_size": engine.tensor_parallel_size,
                      "max_num_seqs": engine.max_num_seqs,
                      "speculative_config": engine.speculative_config}))
"""


def test_vllm_accepts_every_flag_the_chart_passes(default_manifests: list[Manifest]) -> None:
    book = load_variants(REPO / "serving" / "variants.yaml")
    argvs = [
        containers(find(default_manifests, "Deployment", f"-vllm-{tier}"))[0]["args"]
        for tier in TIERS
    ]
    result = subprocess.run(
        [sys.executable, "-c", _VLLM_PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for tier, engine in zip(TIERS, parsed, strict=True):
        expected = book.engine_args(tier, "gpu")
        assert engine["tensor_parallel_size"] == expected["tensor-parallel-size"]
        assert engine["max_num_seqs"] == expected["max-num-seqs"]
        spec = expected.get("speculative-config")
        assert engine["speculative_config"] == (json.loads(spec) if spec else None)


def test_every_rollout_worker_process_is_scraped(
    chart: helm.Chart, production_manifests: list[Manifest], production_values: dict[str, Any]
) -> None:
    """Process N of `cstack worker rollouts` serves /metrics on CSTACK_RL_METRICS_PORT + N."""
    rollouts = chart.merge_values(production_values)["rollouts"]
    container = containers(find(production_manifests, "Deployment", "-rollouts"))[0]
    base = int(env_of(container)["CSTACK_RL_METRICS_PORT"]["value"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert sorted(ports.values()) == [base + n for n in range(rollouts["concurrency"])]

    service = find(production_manifests, "Service", "-rollouts")
    monitor = find(production_manifests, "ServiceMonitor", "composer-stack")
    scraped = {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]}
    assert {port["name"] for port in service["spec"]["ports"]} == set(ports) <= scraped

    policy = find(production_manifests, "NetworkPolicy", "-workers-ingress")
    allowed = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    assert set(ports) <= allowed


def test_a_redis_cluster_keeps_celery_and_the_trainer_on_a_single_redis(
    render: Render,
) -> None:
    """With a Redis Cluster's URL under `key`, the gateway and billing read it, while
    Celery (billing's worker and beat, the rollouts) and the trainer's stream use the
    single Redis under `celeryBrokerKey`, all from the same Secret."""
    external = {"existingSecret": "state-redis", "key": "cluster-url", "celeryBrokerKey": "broker"}
    manifests = render(
        {
            **SECRET_REFERENCE,
            "redis": {"enabled": False, "external": external},
            "rollouts": {"enabled": True},
            "trainer": {"enabled": True},
        }
    )

    def redis_env(kind: str, workload: str) -> dict[str, tuple[str, str]]:
        env = env_of(containers(find(manifests, kind, workload))[0])
        return {
            name: (ref["name"], ref["key"])
            for name, entry in env.items()
            if name in ("CSTACK_REDIS_URL", "CSTACK_CELERY_BROKER_URL")
            for ref in [entry["valueFrom"]["secretKeyRef"]]
        }

    state, broker = ("state-redis", "cluster-url"), ("state-redis", "broker")
    for workload in ("-gateway", "-billing-worker", "-billing-beat"):
        assert redis_env("Deployment", workload) == {
            "CSTACK_REDIS_URL": state,
            "CSTACK_CELERY_BROKER_URL": broker,
        }
    assert redis_env("Deployment", "-rollouts") == {"CSTACK_REDIS_URL": broker}
    assert redis_env("Job", "-trainer") == {"CSTACK_REDIS_URL": broker}
