# One image for every fedboost role: party workers, the deployment runner, the Prefect server.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false OMP_NUM_THREADS=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY boosting ./boosting
COPY crypto ./crypto
COPY messages ./messages
COPY workers ./workers
COPY flows ./flows
COPY fedboost ./fedboost
RUN pip install . \
    && useradd --create-home --uid 10001 fedboost \
    && mkdir -p /models && chown fedboost /models

USER fedboost
ENTRYPOINT ["fedboost"]
CMD ["--help"]
