"""Rollouts: Celery workers, environments, exactly-once trajectory publishing, the policy
version gate, and weight sync into the running vLLM engines.

Import from the defining module; this file imports nothing, so ``cstack --help`` stays fast.
"""
