"""The DeepSeek-V3 architecture (the Kimi K2.5 text backbone): MLA attention, MoE with a
shared expert and sigmoid ``noaux_tc`` routing, YaRN rope, HF checkpoint I/O, and the
function that applies the meshes to a built model (``parallelize``).
"""
