"""Training: the composer-2.5 model, its optimizer, its parallelism, the trainer, the RL loop.

Import from the module that defines a name (``from training.trainer.loop import Trainer``); this
package file imports nothing, so ``import training.<sub>`` (the CLI, the task builder) does
not pay for torch. The README's architecture section maps each flow to its folders.
"""
