# One image for all services: executor, workers (the worker manager) and gateway.
#
# Dependencies are installed from a local wheelhouse, so a build needs no network:
#   pip wheel -w wheels -c .ci/constraints.txt torch==2.13.0 .
# (torch pinned: resolved alone, pip picks a CUDA torch; the rest at the versions CI passed with)
# BASE must provide python3.11 with venv; python:3.11-slim-bookworm or a debootstrap'ed
# Debian bookworm with python3-venv both work.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_WAIT_POLICY=PASSIVE \
    TOKENIZERS_PARALLELISM=false \
    SYMBIOSIS_DATA_DIR=/data \
    SYMBIOSIS_MODEL_CACHE=/data/models \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml README.md ./
COPY wire wire
COPY catalogue catalogue
COPY executor executor
COPY workers workers
COPY gateway gateway
COPY launcher launcher
COPY openapi openapi
COPY state state
RUN --mount=type=bind,source=wheels,target=/wheels \
    pip install --no-index --find-links /wheels torch==2.13.0 \
 && pip install --no-index --find-links /wheels .

VOLUME /data
EXPOSE 8000 5555 5556
CMD ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8000"]
