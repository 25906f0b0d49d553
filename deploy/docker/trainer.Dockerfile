# syntax=docker/dockerfile:1
# The RL trainer (`torchrun ... cstack train`). Built on the vLLM image so torch, CUDA and
# NCCL are exactly the versions the serving engines load the trainer's checkpoints with.
#   docker build -f deploy/docker/trainer.Dockerfile -t composer-stack/trainer:0.1.0 .
FROM vllm/vllm-openai:v0.32.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY serving serving
COPY gateway gateway
COPY billing billing
COPY training training
COPY deploy deploy
# The base distribution does not depend on torch (only its cpu/gpu extras do), so this
# keeps the image's torch and CUDA as they are.
RUN pip install --no-cache-dir . \
 && rm -rf /src
RUN groupadd --gid 10001 cstack \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /scratch --shell /usr/sbin/nologin cstack
ENV HOME=/scratch \
    PYTHONUNBUFFERED=1
WORKDIR /scratch
USER 10001:10001
ENTRYPOINT ["torchrun"]
