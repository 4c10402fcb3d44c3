# The bundled servables behind gRPC (5500) and RESTful (1500), models exported at build time.
#
#   docker build -t mindspore-serving .
#   openssl rand -hex 32 > api_key && chmod 600 api_key && sudo chown 10001 api_key  # the image's user only
#   docker run --rm --stop-timeout 20 -p 5500:5500 -p 1500:1500 \
#       -v "$PWD/api_key:/run/secrets/mindspore-serving/api_key:ro" mindspore-serving
#
# The API key is read from a secret file, /run/secrets/mindspore-serving/api_key (Kubernetes: the Secret
# mindspore-serving-api-key, deploy/deployment.yaml; docker: `-v "$PWD/api_key:/run/secrets/mindspore-serving/
# api_key:ro"`, or a compose secret with that target); without it the server refuses to start.
# Arguments after the image name replace CMD (the listen addresses, the key file and --grace); keep 0.0.0.0 so
# that the ports are reachable from outside the container. `docker stop` waits 10 s by default before SIGKILL:
# give it at least --grace + 5 s (--stop-timeout above) so that requests in flight can finish.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# libgomp1: MindSpore's CPU libraries link OpenMP; make: `make models`; tini: PID 1 that reaps orphans and
# forwards SIGTERM to the server only (the server drains and then stops its workers itself).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 make tini \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin serving

WORKDIR /app

# The pinned dependencies first, in their own layer: rebuilt only when requirements.txt changes.
COPY requirements.txt ./
RUN python -m venv .venv && .venv/bin/pip install -r requirements.txt

COPY . .
# The stamp tells the Makefile that .venv is set up (without the test-only requirements-dev.txt), so that
# `make models` only exports the MindIR graphs. MindSpore writes most of them readable by their owner
# only (0400): open them to the serving user, read-only.
RUN .venv/bin/pip install --no-deps -e . \
    && touch .venv/.installed \
    && make models \
    && chmod -R a+rX servables \
    && chown serving:serving /app

# The code and the models stay root-owned and read-only; the server writes serving_logs/ and
# unix_socket_files/ into /app, which the serving user owns.
USER serving
ENV PATH=/app/.venv/bin:$PATH

EXPOSE 5500 1500

# For `docker run` only (Kubernetes uses its own probes); it assumes the RESTful port stays 1500.
HEALTHCHECK --start-period=300s --interval=30s --timeout=5s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:1500/health', timeout=4)"]

ENTRYPOINT ["tini", "--", "python", "serving_server.py"]
# `--open_api metrics` lets a Prometheus scraper read /metrics without the key.
CMD ["--grpc", "0.0.0.0:5500", "--rest", "0.0.0.0:1500", "--grace", "10", \
     "--api_key_file", "/run/secrets/mindspore-serving/api_key", "--open_api", "metrics"]
