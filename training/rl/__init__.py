"""RL objective: GRPO with targeted text feedback, the trainer hook, the trajectory consumer,
the loop that ties rollouts to the trainer, and ``cstack rl`` (one local session).

Import from the defining module (``from training.rl.learner.loop import RlLoop``); this file
imports nothing, so ``cstack --help`` and ``training.rl.learner.cli`` do not import torch.
"""
