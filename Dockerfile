# An Airflow image with onceflow and all its extras installed from this repository, pinned by uv.lock.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
USER root
RUN apt-get update && apt-get install -y --no-install-recommends util-linux && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:root pyproject.toml uv.lock README.md /opt/onceflow/
COPY --chown=airflow:root providers /opt/onceflow/providers
COPY --chown=airflow:root docs /opt/onceflow/docs
RUN pip install --no-cache-dir uv \
 && cd /opt/onceflow \
 && uv export --frozen --no-dev --all-extras --no-emit-project --no-hashes -o /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps /opt/onceflow
