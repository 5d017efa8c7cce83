# The bus's processes for Kubernetes (deploy/helm/deltabus): producer, ETL, consumers and
# serving sinks. `deltabus` with the pathway and serve extras exactly as uv.lock pins them;
# nothing of Dagster (its code location is platform/Dockerfile's image).
#   docker build -f platform/bus.Dockerfile -t <registry>/deltabus:<tag> .
#   docker run --rm <registry>/deltabus:<tag> etl --help
# No secret is baked in: .dockerignore keeps .env out; settings and credentials come from
# the environment (DELTABUS_*, the AWS chain) at run time.

ARG PYTHON_IMAGE=python:3.11-slim

# -- builder: the locked environment in /app/.venv ----------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ARG UV_VERSION=0.13.8
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv

RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src

# Dependencies first (a cached layer while only the code changes), exactly as locked; the
# dev tools are an extra of their own and stay out.
COPY pyproject.toml uv.lock ./
RUN uv sync --frozen --extra pathway --extra serve --no-install-project --no-editable

# The package itself, installed as a wheel (no reference back to /src).
COPY README.md ./
COPY deltabus/ deltabus/
RUN uv sync --frozen --extra pathway --extra serve --no-editable

# -- runtime: the environment and a user, nothing else ------------------------------------
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/app/.venv/bin:$PATH \
    HOME=/tmp \
    GX_ANALYTICS_ENABLED=false

RUN groupadd --system --gid 10001 deltabus \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin deltabus

COPY --from=builder /app/.venv /app/.venv

# Nothing here is writable by the user: no stray .env is read, and the root filesystem
# can be mounted read-only (temporary files go to /tmp).
WORKDIR /app
USER 10001:10001

# `deltabus --health-port 8080` (or DELTABUS_HEALTH_PORT=8080): /healthz and /readyz.
EXPOSE 8080
ENTRYPOINT ["deltabus"]
CMD ["--help"]
