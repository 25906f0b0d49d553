"""Model-agnostic parallelism: the two meshes (dense HSDP, experts), context parallelism,
expert parallelism, and the collectives they need on both gloo and NCCL.
"""
