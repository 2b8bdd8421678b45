# The official Airflow image plus onceflow: the provider wheel with all its extras, pinned to the
# versions uv.lock tested, and Apertium with its English-Spanish pair for offline translation.
# Used by docker-compose.yaml; for the official Helm chart see docs/deploy.md.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11

# Stage 1: build the wheel and the constraints from the lock (nothing of this stage ships).
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION} AS wheel
COPY --chown=airflow:root pyproject.toml uv.lock README.md /src/
COPY --chown=airflow:root providers /src/providers
COPY --chown=airflow:root docs /src/docs
RUN pip install --no-cache-dir uv \
 && cd /src \
 && uv build --wheel --out-dir /tmp/dist \
 && uv export --frozen --no-dev --all-extras --no-emit-project --no-hashes -o /tmp/dist/constraints.txt

# Stage 2: the image.
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
USER root
# apertium + apertium-eng-spa: the article chain's translator without Google (docs/deploy.md);
# util-linux: unshare, for the DAG parse guard.
RUN apt-get update \
 && apt-get install -y --no-install-recommends apertium apertium-eng-spa util-linux \
 && apt-get autoremove -yqq --purge \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --from=wheel /tmp/dist /tmp/dist
# Airflow named with its version, as the image docs ask, so pip can never up- or downgrade it.
RUN pip install --no-cache-dir \
      "apache-airflow==${AIRFLOW_VERSION}" \
      "$(ls /tmp/dist/airflow_provider_onceflow-*.whl)[all]" \
      --constraint /tmp/dist/constraints.txt \
 && rm -rf /tmp/dist
COPY --chown=airflow:root deploy/watchdog.toml /opt/onceflow/watchdog.toml
