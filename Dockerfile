# One image for every fedboost role: party workers, the deployment runner, the Prefect server.
# Its processes run as the user fedboost (uid 10001); docker-compose.yml starts the services that
# hold a private key as root, for deploy/entrypoint.sh to hand the keys to that user first.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false OMP_NUM_THREADS=1

WORKDIR /app
# the dependencies first, in a layer of their own: a change of fedboost's code or README
# reuses it (empty packages and README stand in for them here)
COPY pyproject.toml ./
RUN for package in boosting crypto messages workers flows fedboost; do \
        mkdir -p "$package" && touch "$package/__init__.py"; done \
    && touch README.md && pip install "setuptools>=68" . && pip uninstall -y fedboost \
    && rm -rf build ./*.egg-info README.md
COPY README.md setup.py ./
COPY boosting ./boosting
COPY crypto ./crypto
COPY messages ./messages
COPY workers ./workers
COPY flows ./flows
COPY fedboost ./fedboost
COPY deploy/entrypoint.sh /usr/local/bin/fedboost-entrypoint
COPY deploy/healthcheck.py /usr/local/bin/fedboost-healthcheck
# the C bin-products kernel (crypto._bin_products) is compiled against GMP here; the compiler
# and headers go again, GMP's library stays; the import fails the build if it was not built
# (Python's headers come with the official image; a Debian-built Python needs python3-dev)
# writable for fedboost: /models (model parts and checkpoints), /prefect (the Prefect server's
# database and UI files), its home (Prefect's and numba's caches) and /tmp; nothing else
# (docker-compose.yml mounts the root read-only, tmpfs on the home, /tmp, /keys, /tls and
# /passwords). No apt cache stays: a base image without Docker's apt clean-up (the stand-ins,
# deploy/stand-in-images.sh) kept 135 MB of downloaded packages
RUN build="gcc libc6-dev libgmp-dev" \
    && include=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])") \
    && { [ -e "$include/Python.h" ] || build="$build python3-dev"; } \
    && apt-get update && apt-get install -y --no-install-recommends $build \
    && pip install --no-deps --no-build-isolation . && rm -rf build ./*.egg-info \
    && apt-mark manual libgmp10 && apt-get purge -y --auto-remove $build \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
    && cd / && python -c "import crypto._bin_products" && cd /app \
    && useradd --create-home --uid 10001 --user-group fedboost \
    && mkdir -p /models /prefect /keys /tls /passwords && chown fedboost:fedboost /models /prefect \
    && chmod 755 /usr/local/bin/fedboost-entrypoint /usr/local/bin/fedboost-healthcheck

# numba's compiled kernels: site-packages is read-only in the containers (a tmpfs /tmp is not)
ENV NUMBA_CACHE_DIR=/tmp/numba-cache
USER fedboost
ENTRYPOINT ["fedboost-entrypoint"]
CMD ["--help"]
