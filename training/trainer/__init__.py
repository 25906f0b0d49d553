"""The trainer: its configuration (``config``), the CLI options derived from it
(``options``), the loop (``loop.Trainer``) and the torchrun entry point (``launch``).
Import from the defining module; this file imports nothing."""
