# clef-router image: a slim Python base plus the PyPI torch wheels, which bring their own CUDA 13 libraries
# (nvidia-* packages): CUDA is in the image once. The same image runs on a GPU host (needs an NVIDIA driver
# recent enough for CUDA 13 and the NVIDIA Container Toolkit) and on the CPU (docker-compose.yml's demo).
#   docker build -t clef-router .
# `docker images` showed 5.5GB for it (built by scripts/compose-smoke.sh on its debootstrap base).
# A CPU-only image for the demo profile (torch without the CUDA libraries), from PyTorch's CPU wheel index,
# whose address (pytorch.org's install page lists it) you pass in:
#   docker build --build-arg TORCH_VARIANT=cpu --build-arg TORCH_INDEX_URL=<PyTorch CPU wheel index> -t clef-router:cpu .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG TORCH_VARIANT=cuda
ARG TORCH_INDEX_URL=

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/clef/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && python -m venv /opt/clef

WORKDIR /src
# the large pinned dependencies first, in their own layer, so code changes do not reinstall torch
COPY constraints.txt ./
RUN case "$TORCH_VARIANT" in \
        cuda) ;; \
        cpu) [ -n "$TORCH_INDEX_URL" ] || { echo "TORCH_VARIANT=cpu needs TORCH_INDEX_URL (PyTorch's CPU wheel index)" >&2; exit 2; }; \
             pip install -c constraints.txt --index-url "$TORCH_INDEX_URL" torch ;; \
        *) echo "TORCH_VARIANT must be cuda or cpu, not '$TORCH_VARIANT'" >&2; exit 2 ;; \
    esac \
    && pip install -c constraints.txt torch transformers
# SM90_KERNELS=1 adds what CLEF_ENGINE__SM90_EXPERTS=true compiles its CUDA kernels with at start: nvcc and its
# headers from NVIDIA's PyPI wheels, ninja and g++ (python3-dev too on a base without Python's headers). All
# wheels at CUDA 13.0, as torch's runtime: a newer nvvm writes PTX that this ptxas refuses. /usr/local/cuda
# points at the wheels' folder, where torch's extension builder looks. 6.22 GB against 5.5 GB; off by default.
ARG SM90_KERNELS=0
RUN case "$SM90_KERNELS" in \
        0) ;; \
        1) inc="$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
           && dev="$([ -f "$inc/Python.h" ] || echo python3-dev)" \
           && apt-get update \
           && apt-get install -y --no-install-recommends g++ $dev \
           && rm -rf /var/lib/apt/lists/* \
           && pip install -c constraints.txt nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
               nvidia-cuda-cccl==13.0.85 ninja==1.13.2 \
           && cu="$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nvidia/cu13" \
           && ln -s lib "$cu/lib64" \
           && ln -s libcudart.so.13 "$cu/lib/libcudart.so" \
           && ln -s "$cu" /usr/local/cuda \
           && /usr/local/cuda/bin/nvcc --version ;; \
        *) echo "SM90_KERNELS must be 0 or 1, not '$SM90_KERNELS'" >&2; exit 2 ;; \
    esac
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY engine ./engine
COPY consumer ./consumer
# the product wheel ships no dev tools; the compose demo runs `clef-router make-tiny-release` (and may use
# `--stub-engine`) in this image, so the dev tools' package goes beside the installed product
COPY devtools ./devtools
RUN pip install -c constraints.txt . \
    && cp -r devtools "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/" \
    && (cd / && python -c 'import devtools.tiny_release') \
    && rm -rf /src

# /models/clef-omni: the real release (bind mount); /models/demo: the tiny release of the compose demo
# (a named volume, which takes this folder's owner when first created)
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin clef \
    && mkdir -p /models/clef-omni /models/demo && chown clef:clef /models/clef-omni /models/demo
USER clef
WORKDIR /home/clef

ENV CLEF_ENGINE__MODEL_PATH=/models/clef-omni \
    CLEF_ENGINE__DEVICE=cuda \
    CLEF_HTTP__HOST=0.0.0.0 \
    CLEF_HTTP__PORT=8080 \
    TORCHINDUCTOR_CACHE_DIR=/home/clef/.cache/torchinductor
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=4 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

# tini forwards SIGTERM so the service drains, commits and exits 0
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["clef-router", "run"]
