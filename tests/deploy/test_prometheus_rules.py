"""Alert rules and scrape configuration, checked and unit-tested by promtool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from chart_support import REPO, Manifest, find

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yaml"
#: Every alert is `<signal> <comparison> <number>`, so its signal can be graphed alone.
ALERT_FORM = re.compile(
    r"^(?P<signal>.+?)\s*(?:>|<|>=|<=|==|!=)\s*(?P<threshold>[0-9.e+-]+)$", re.S
)


def _run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=60, check=False)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules(promtool: str) -> None:
    result = _run(promtool, "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_every_alert_fires_in_promtools_unit_tests(promtool: str) -> None:
    result = _run(promtool, "test", "rules", "alerts.test.yaml", cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts.test.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == {rule["alert"] for rule in alert_rules()}


def test_alerts_compare_a_signal_with_a_threshold() -> None:
    for rule in alert_rules():
        assert ALERT_FORM.match(rule["expr"].strip()), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_scrape_config_is_valid(promtool: str, tmp_path: Path) -> None:
    """Debian's Prometheus is built without Kubernetes service discovery, so the check
    runs on the same configuration with its discovery swapped for a static target."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "endpoints"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = _run(promtool, "check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_charts_prometheus_rule_passes_promtool(
    promtool: str, production_manifests: list[Manifest], tmp_path: Path
) -> None:
    rule = find(production_manifests, "PrometheusRule", "composer-stack")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = _run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
