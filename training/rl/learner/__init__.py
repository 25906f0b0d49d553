"""The learner: GRPO with targeted text feedback in the trainer, the trajectory consumer,
the loop that ties rollouts to the trainer, and ``cstack rl`` (one local session).

Import from the defining module (``from training.rl.learner.loop import RlLoop``); this
file imports nothing, so ``cstack --help`` does not import torch.
"""
