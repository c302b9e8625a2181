# The krypton operator image: Python, the krypton package and a helm binary built from its
# Go module (the same pinned version the test bed uses).
ARG HELM_VERSION=v4.2.4

FROM golang:1.26 AS helm
ARG HELM_VERSION
RUN CGO_ENABLED=0 GOBIN=/out go install \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}" \
      "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}"

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY krypton ./krypton
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
COPY --from=helm /out/helm /usr/local/bin/helm
USER 65532:65532
ENV HOME=/tmp PYTHONUNBUFFERED=1
ENTRYPOINT ["krypton"]
CMD ["run"]
