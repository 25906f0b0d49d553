# syntax=docker/dockerfile:1
# vLLM on the upstream image, plus a non-root user and three modules: the chart renders the
# engine arguments from serving/variants.yaml, so nothing else composer-specific is baked
# in. The modules are the weight-reload worker extension (`weight_sync` in the variants
# file) with the transport its streamed pushes arrive by (torch only), which the
# trainer's live weight pushes need, and the tiny checkpoint's reasoning
# parser (the cpu profile's `reasoning-parser-plugin`); the package files above them
# import nothing (their exports load lazily), so the image needs no other project code.
#   docker build -f deploy/docker/vllm.Dockerfile -t composer-stack/vllm:0.32.0 .
FROM vllm/vllm-openai:v0.32.0
RUN groupadd --gid 10001 cstack \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /scratch --shell /usr/sbin/nologin cstack
# Caches (torch.compile, Triton, vLLM) go under HOME, a scratch volume in the cluster.
ENV HOME=/scratch \
    HF_HUB_OFFLINE=1
COPY training/__init__.py /opt/cstack/training/__init__.py
COPY training/rl/__init__.py /opt/cstack/training/rl/__init__.py
COPY training/rl/rollouts/__init__.py /opt/cstack/training/rl/rollouts/__init__.py
COPY training/rl/rollouts/vllm_extension.py /opt/cstack/training/rl/rollouts/vllm_extension.py
COPY training/rl/rollouts/weight_transport.py /opt/cstack/training/rl/rollouts/weight_transport.py
COPY serving/__init__.py /opt/cstack/serving/__init__.py
COPY serving/reasoning.py /opt/cstack/serving/reasoning.py
ENV PYTHONPATH=/opt/cstack
USER 10001:10001
EXPOSE 8000
# `vllm serve` and this module are the same server; the module form is what
# serving.VllmServer runs, so both environments start vLLM identically.
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
