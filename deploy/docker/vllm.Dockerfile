# syntax=docker/dockerfile:1
# vLLM on the upstream image, unchanged but for a non-root user: the chart renders the
# engine arguments from serving/variants.yaml, so nothing composer-specific is baked in.
#   docker build -f deploy/docker/vllm.Dockerfile -t composer-stack/vllm:0.32.0 .
FROM vllm/vllm-openai:v0.32.0
RUN groupadd --gid 10001 cstack \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /scratch --shell /usr/sbin/nologin cstack
# Caches (torch.compile, Triton, vLLM) go under HOME, a scratch volume in the cluster.
ENV HOME=/scratch \
    HF_HUB_OFFLINE=1
USER 10001:10001
EXPOSE 8000
# `vllm serve` and this module are the same server; the module form is what
# serving.VllmServer runs, so both environments start vLLM identically.
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
