# ckpt-advisor service: FastAPI over ckpt_core, CPU-only torch, non-root, offline.
#
#   docker build -t ckpt-advisor .
#   docker run --rm -p 8000:8000 --read-only --tmpfs /tmp ckpt-advisor
#
# Settings are CKPT_* environment variables (docs/service.md, "Settings").

ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# The service builds models on the meta device only: the CPU torch wheel is
# enough, and the default PyPI torch is a CUDA build of several GB.  This
# index serves the +cpu wheel, which pip prefers to PyPI's for the pinned
# version.  Empty: no extra index (use PIP_FIND_LINKS to a local wheel).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# A directory of local wheels (e.g. bind-mounted at build time); pip reads it
# from the environment.  Empty: none.
ARG PIP_FIND_LINKS=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/service.lock ./requirements/
COPY ckpt_core ./ckpt_core
COPY service ./service

# One pip call: the [service] extra at the exact versions of the lock file
# (scripts/lock.sh).  DL3013 (unpinned pip install) does not apply: this
# installs the local project, every dependency constrained by the lock.
# hadolint ignore=DL3013
RUN python3 -m venv "$VIRTUAL_ENV" \
    && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        -c requirements/service.lock ".[service]" \
    && python -c "import torch; assert not torch.version.cuda, 'CUDA torch installed'" \
    && rm -rf /src

# A numeric non-root user (Kubernetes runAsNonRoot needs a number).
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin ckpt
USER 10001:10001
WORKDIR /home/ckpt

# Never reach the Hub: configs come from bundled presets or the request.
# Runs on a read-only root filesystem with a tmpfs on /tmp (--read-only
# --tmpfs /tmp): scripts/container_test.sh finds only the forkserver's
# socket directory and torch's inductor cache directory written there; the
# Hugging Face cache root points there too, not into the read-only home.
ENV HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/huggingface \
    CKPT_HOST=0.0.0.0 \
    CKPT_PORT=8000 \
    CKPT_PROXY_HEADERS=true \
    CKPT_FORWARDED_ALLOW_IPS=127.0.0.1 \
    CKPT_GRACEFUL_SHUTDOWN_S=20

EXPOSE 8000

# Liveness: the process answers.  Readiness (workers warm) is GET /readyz.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CKPT_PORT', '8000'), timeout=4)"]

# uvicorn with host, port, proxy headers and graceful shutdown from CKPT_*.
CMD ["python", "-m", "service"]
