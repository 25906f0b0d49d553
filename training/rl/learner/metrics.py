"""The RL loop's own metrics, set by the trainer after each step (no per-task labels:
task ids are unbounded).

- ``cstack_rl_hint_teacher_margin``: on the turns that got text feedback, how much less
  likely the hinted policy (the teacher) makes those turns' tokens than the policy itself
  does, in nats per token, averaged over all of their tokens (the last step that had
  feedback; long turns, most of whose tokens the hint does not change, dilute it).
  Distillation only helps while the teacher knows better, i.e. while this is clearly
  positive; RL can erase the policy's use of the hint, and then the margin falls to zero
  (alert ``HintTeacherNoBetter``). It is the environment-agnostic form of "the valid share
  with the hint": for the toolchoice environment, whose turn is the tool name, an invalid
  tool the hinted policy would not have called.
- ``cstack_rl_mismatch_kl``: KL(engine || trainer) per trained token (training.rl.learner.losses).
- ``cstack_rl_capped_token_share``: tokens whose importance ratio the correction capped.
- ``cstack_rl_skipped_groups_total``: groups not trained on (equal rewards).
- ``cstack_rl_tasks{state}``: tasks still drawn (``active``) and retired as solved.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

HINT_TEACHER_MARGIN = Gauge(
    "cstack_rl_hint_teacher_margin",
    "Nats per token by which the hinted policy makes the flagged tokens less likely.",
)
MISMATCH_KL = Gauge("cstack_rl_mismatch_kl", "KL(engine || trainer) per trained token.")
CAPPED_TOKEN_SHARE = Gauge(
    "cstack_rl_capped_token_share", "Share of trained tokens whose ratio was capped."
)
SKIPPED_GROUPS = Counter(
    "cstack_rl_skipped_groups_total", "Groups not trained on: their rewards were all equal."
)
TASKS = Gauge("cstack_rl_tasks", "Tasks of the curriculum.", ["state"])
