"""Muon (per attention head, per expert), plain and sharded over FSDP2's dim-0 shards.

Dependencies run one way: ``config`` <- ``newton_schulz``, ``matrix_layout`` <-
``shard_plan`` <- ``sharded_muon`` <- ``muon``; ``muon_reference`` (the plain per-matrix
oracle the tests hold the rest to) reads only ``config`` and ``matrix_layout``. Nothing
here imports the model.
"""
