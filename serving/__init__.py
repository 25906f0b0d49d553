"""Serving: the tiers, their vLLM variants, the vLLM launcher and the tiny checkpoint.

Import from the defining modules (``serving.vocabulary``, ``serving.variants``,
``serving.engine``, ``serving.process``, ``serving.settings``, ``serving.tiny``;
``serving.reasoning`` is vLLM's, a reasoning parser plugin its engines load). Importing
any of them runs this file first, and billing and the gateway import ``serving.vocabulary`` in
their contracts, so it must stay cheap.
"""
