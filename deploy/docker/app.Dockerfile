# syntax=docker/dockerfile:1
# One image for the gateway, the billing worker and beat, and the rollout workers: the
# `composer-stack` distribution without an engine (`cstack gateway`, `cstack worker ...`,
# `cstack beat`). Build from the repository root:
#   docker build -f deploy/docker/app.Dockerfile -t composer-stack/app:0.1.0 .
# The rollouts extra brings pytest: rollout workers run each task's tests (in bwrap).
# Every distribution is pinned to the tested versions (constraints-cpu.txt, what CI runs):
# the gateway's HTTP/1 server subclasses uvicorn's protocol class and billing's RESP
# parser builds on redis-py's parser module, neither of them a public API.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md constraints-cpu.txt ./
COPY serving serving
COPY gateway gateway
COPY billing billing
COPY training training
COPY deploy deploy
RUN python -m venv /opt/cstack \
 && /opt/cstack/bin/pip install --no-cache-dir -c constraints-cpu.txt '.[rollouts]'

FROM python:3.11-slim
# The uid/gid the chart runs every pod as (podSecurityContext.runAsUser).
RUN groupadd --gid 10001 cstack \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin cstack
COPY --from=build /opt/cstack /opt/cstack
ENV PATH=/opt/cstack/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The root filesystem is read-only in the cluster; /tmp is a scratch volume there.
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["cstack"]
CMD ["gateway", "--host", "0.0.0.0", "--port", "8080"]
