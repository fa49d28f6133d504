# One image for every gpu-slicer component: the admission webhook, the node agent and the
# certificate job all run `gpu-slicer <command>` (see deploy/). Build with:
#   docker build -t gpu-slicer:0.2.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: install the package and its dependencies into a self-contained virtualenv --------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
# gpu_slicer/ links the package folders below into one import namespace. The development
# sandbox is neither copied nor installed (its link in gpu_slicer/ is left dangling).
COPY gpu_slicer/ gpu_slicer/
COPY core/ core/
COPY cli/ cli/
COPY kube/ kube/
COPY slicer/ slicer/
COPY webhook/ webhook/
COPY certs/ certs/
COPY sim/ sim/
COPY status/ status/
COPY plan/ plan/
RUN python -m venv /opt/gpu-slicer \
    && /opt/gpu-slicer/bin/pip install --no-cache-dir . \
    && /opt/gpu-slicer/bin/python -m compileall -q /opt/gpu-slicer

# --- runtime: the virtualenv on a fresh slim base, no compilers, no source tree --------------
FROM ${PYTHON_IMAGE} AS runtime
# An ARG declared before the first FROM is seen only by FROM lines: declared again here so that
# the base.name label below gets its value (it was empty before).
ARG PYTHON_IMAGE
ARG VERSION=0.2.0
# Where the source lives and which commit: pass --build-arg SOURCE=<repository URL> and
# --build-arg REVISION=$(git rev-parse HEAD) in CI.
ARG SOURCE=""
ARG REVISION=""
LABEL org.opencontainers.image.title="gpu-slicer" \
      org.opencontainers.image.description="Admission webhook and DRA node agent that move GPU workloads from the device plugin to Kubernetes DRA with just-in-time MIG slices" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=build /opt/gpu-slicer /opt/gpu-slicer
ENV PATH=/opt/gpu-slicer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the webhook and the certificate job run as this user under a read-only
# root filesystem). The node agent's DaemonSet overrides it with runAsUser: 0: it needs the
# kubelet's plugin sockets and NVML's MIG devices (deploy/base/agent-daemonset.yaml).
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["gpu-slicer"]
CMD ["--help"]
