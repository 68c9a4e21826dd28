# clef-router on a CUDA host: docker build -t clef-router . && docker run --gpus 1 -v /path/to/clef-omni:/models/clef-omni:ro ...
# torch's PyPI wheels bring their own CUDA 13 libraries; the base image supplies the CUDA runtime layout
# and expects an NVIDIA driver recent enough for CUDA 13 on the host.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/clef/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/clef

WORKDIR /src
# the large pinned dependencies first, in their own layer, so code changes do not reinstall torch
COPY constraints.txt ./
RUN pip install -c constraints.txt torch transformers
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY engine ./engine
COPY consumer ./consumer
COPY bench ./bench
RUN pip install -c constraints.txt . && rm -rf /src

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin clef \
    && mkdir -p /models/clef-omni && chown clef:clef /models/clef-omni
USER clef
WORKDIR /home/clef
VOLUME ["/models/clef-omni"]

ENV CLEF_ENGINE__MODEL_PATH=/models/clef-omni \
    CLEF_ENGINE__DEVICE=cuda \
    CLEF_HTTP__HOST=0.0.0.0 \
    CLEF_HTTP__PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=4 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

# tini forwards SIGTERM so the service drains, commits and exits 0
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["clef-router", "run"]
