"""The trainer's components: checkpoints (DCP and HF export), the data pipeline, the loss
functions and the trainer's Prometheus metrics. Each imports torch; import the module."""
