"""Everything of reinforcement learning, under one roof: the record of an episode
(``trajectory``), targeted text feedback (``feedback``), the Celery work queue, the agent
harness and its sandbox (``agent``), feature-deletion tasks (``tasks``), the reward-hack
monitor (``monitor``), rollout workers and weight sync (``rollouts``), the only module that
computes a reward (``rewards``) and the learner: GRPO in the trainer, the loop and
``cstack rl`` (``learner``).

Import from the defining module (``from training.rl.learner.loop import RlLoop``); this
file imports nothing, so ``cstack --help`` does not import torch.
"""
