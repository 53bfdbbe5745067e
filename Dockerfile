# One image for every gnnsched component: operator, extender, node agent, device plugin, gate client and worker.
#
#   docker build -t gnnsched:cpu .                                   # CPU torch (extender, operator, CI clusters)
#   docker build -t gnnsched:cu124 --build-arg TORCH_FLAVOR=cu124 .  # CUDA torch (GPU nodes running gnnsched worker)
#
# TORCH_FLAVOR picks the PyTorch wheel index (cpu, cu124, cu126, ...); TORCH_VERSION must satisfy pyproject's range.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_FLAVOR=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_FLAVOR}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gnnsched
ENV PATH=/opt/gnnsched/bin:$PATH
# torch first, from the flavour's index, so the project's dependency resolution never swaps it for another build.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gnnsched ./gnnsched
COPY operator ./operator
COPY extender ./extender
COPY device_plugin ./device_plugin
COPY node_agent ./node_agent
COPY crds ./crds
RUN pip install . && gnnsched --help >/dev/null

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="gnnsched" \
      org.opencontainers.image.description="Memory-safe GPU sharing for GNN jobs on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gnnsched /opt/gnnsched
COPY --from=build /src/crds /opt/gnnsched/crds
ENV PATH=/opt/gnnsched/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Non-root by default (uid 65532). The node DaemonSet's containers override this to uid 0 where the chart explains why.
RUN groupadd --gid 65532 gnnsched && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin gnnsched
USER 65532:65532
ENTRYPOINT ["gnnsched"]
CMD ["--help"]
