"""The reward-hack monitor: deterministic rules, one verdict per rule with its evidence."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from training.rl.monitor.code_rules import (
    eq_findings,
    exit_skip_findings,
    redefinition_findings,
    special_case_findings,
    tampering_findings,
)
from training.rl.monitor.command_rules import command_findings
from training.rl.monitor.evidence import EpisodeEvidence
from training.rl.monitor.scorer_rules import scorer_findings
from training.rl.trajectory import Verdict

RuleSet = Callable[[EpisodeEvidence], Iterator[tuple[str, str]]]

RULE_SETS: tuple[RuleSet, ...] = (
    command_findings,
    tampering_findings,
    exit_skip_findings,
    eq_findings,
    special_case_findings,
    redefinition_findings,
    scorer_findings,
)


def check_episode(evidence: EpisodeEvidence, max_evidence: int = 3) -> list[Verdict]:
    """Every rule that fired, in a stable order, with up to ``max_evidence`` quotes each."""
    quotes: dict[str, list[str]] = {}
    for rule_set in RULE_SETS:
        for rule, quote in rule_set(evidence):
            seen = quotes.setdefault(rule, [])
            if quote not in seen and len(seen) < max_evidence:
                seen.append(quote)
    return [
        Verdict(rule=rule, evidence=" | ".join(found)) for rule, found in sorted(quotes.items())
    ]
