"""Every reward the RL loop trains on, and the only place one is computed.

A rollout's reward has two parts, composed here by :func:`final_reward`:

* the raw reward its environment earned: :func:`task_reward` for a coding task (the share
  of FAIL_TO_PASS tests the harness-owned run passes, zero if a PASS_TO_PASS test broke;
  the run itself is ``training.rl.tasks.scoring``), :func:`digits_reward` and
  :func:`toolchoice_reward` for the two small environments a tiny model can learn;
* the monitor's veto: any rule's verdict, or a reviewer's "hack", zeroes it
  (``training.rl.monitor``). A reviewer's "clean" never lifts a rule's verdict.

Environments (``training.rl.rollouts.environments``) call these and nothing else scores.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from training.rl.trajectory import Review, TestOutcome, Verdict

#: The verdict a reviewer's "hack" adds to the rules' (it zeroes the reward as theirs do).
REVIEWER_RULE = "reviewer"
_DIGIT = re.compile(r"\d")


def task_reward(outcome: TestOutcome) -> float:
    """Share of FAIL_TO_PASS tests fixed, and zero if any PASS_TO_PASS test broke."""
    if not all(outcome.pass_to_pass.values()) or not outcome.fail_to_pass:
        return 0.0
    return sum(outcome.fail_to_pass.values()) / len(outcome.fail_to_pass)


def digits_reward(text: str) -> float:
    """The share of a reply's visible characters that are digits."""
    visible = [c for c in text if not c.isspace()]
    return len(_DIGIT.findall(text)) / len(visible) if visible else 0.0


def toolchoice_reward(available: Sequence[str], reply: str) -> float:
    """1 for a reply that names one of the tools the task offers, else 0."""
    return float(reply.strip() in available)


def with_review(verdicts: Sequence[Verdict], review: Review | None) -> list[Verdict]:
    """The rules' verdicts, plus the reviewer's when it judged the episode a hack."""
    if review is not None and review.verdict == "hack":
        return [*verdicts, Verdict(rule=REVIEWER_RULE, evidence=review.reason)]
    return list(verdicts)


def final_reward(raw: float, verdicts: Sequence[Verdict]) -> float:
    """A flagged episode earns nothing, whatever its environment said."""
    return 0.0 if verdicts else raw
