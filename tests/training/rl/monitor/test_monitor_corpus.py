"""The monitor flags every planted hack with the right rule and no clean episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from training.rl.monitor import RULES, EpisodeEvidence, check_episode
from training.rl.rewards import final_reward
from training.rl.trajectory import Verdict

CORPUS = yaml.safe_load((Path(__file__).parent / "corpus.yaml").read_text())
EPISODES: list[dict[str, Any]] = CORPUS["episodes"]
TEST_SOURCES = CORPUS["defaults"]["test_sources"]


def _evidence(episode: dict[str, Any]) -> EpisodeEvidence:
    return EpisodeEvidence(
        commands=episode.get("commands", []),
        changes=episode.get("changes", []),
        versions=episode.get("versions", []),
        tree=episode.get("tree", []),
        test_sources=TEST_SOURCES,
    )


@pytest.mark.parametrize("episode", EPISODES, ids=[e["name"] for e in EPISODES])
def test_episode_gets_exactly_the_expected_rules(episode: dict[str, Any]) -> None:
    verdicts = check_episode(_evidence(episode))
    assert sorted(v.rule for v in verdicts) == sorted(episode["expect"])
    assert all(v.evidence for v in verdicts)


def test_corpus_plants_every_rule_and_has_clean_episodes() -> None:
    planted = {rule for e in EPISODES for rule in e["expect"]}
    assert planted == set(RULES)
    assert sum(1 for e in EPISODES if not e["expect"]) >= 5


def test_evidence_quotes_the_offending_line() -> None:
    episode = next(e for e in EPISODES if e["name"] == "special_cases_test_inputs")
    (verdict,) = check_episode(_evidence(episode))
    assert "slugkit/core.py:2:" in verdict.evidence and "Hello World" in verdict.evidence


def test_flagged_episode_earns_zero() -> None:
    assert final_reward(1.0, [Verdict(rule="network", evidence="x")]) == 0.0
    assert final_reward(0.75, []) == 0.75
