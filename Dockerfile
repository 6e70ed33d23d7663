# cronoq-server and the cronoq CLI in a small image that runs as a non-root user and works with a
# read-only root filesystem.
#
#   docker build -t cronoq .                       # official slim Python image, packages from PyPI
#   make image                                     # cronoq:dev on a local Debian base, offline
#   docker run --read-only cronoq:dev --check      # validates the baked-in configuration
#
# PYTHON_IMAGE is any Debian-based image with Python 3.11+ and the venv module. The checkout is
# built into a virtualenv in the first stage; its dependencies (and the build backend) come from
# wheels in build/wheelhouse when the context holds some (scripts/build_image.sh puts them there,
# for builds without a network), from PyPI otherwise.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build
LABEL io.cronoq.stage=build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Dependencies first, in a layer of their own that source changes do not invalidate. `build*`
# brings build/wheelhouse/ (as ./wheelhouse) when it is in the context, and nothing otherwise.
COPY pyproject.toml build* ./
RUN set -eux; \
    python3 -m venv /opt/cronoq; \
    python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
        extras = p["optional-dependencies"]; \
        print("\n".join(p["dependencies"] + extras["server"] + extras["operator"]))' > requirements.txt; \
    if ls wheelhouse/*.whl >/dev/null 2>&1; then \
        /opt/cronoq/bin/pip install --no-index --find-links wheelhouse -r requirements.txt; \
    else \
        /opt/cronoq/bin/pip install -r requirements.txt; \
    fi
COPY . .
RUN set -eux; \
    if ls wheelhouse/*.whl >/dev/null 2>&1; then \
        /opt/cronoq/bin/pip install --no-index --find-links wheelhouse '.[server,operator]'; \
    else \
        /opt/cronoq/bin/pip install '.[server,operator]'; \
    fi; \
    /opt/cronoq/bin/cronoq-server --print-proto >/dev/null; \
    /opt/cronoq/bin/python -c 'import cronoq.operator, kopf'; \
    # The installer and the build backend are not needed at run time.
    cd /opt/cronoq/lib/python3*/site-packages; \
    rm -rf pip pip-* setuptools setuptools-* pkg_resources _distutils_hack distutils-precedence.pth \
        wheel wheel-*; \
    rm -f /opt/cronoq/bin/pip* /opt/cronoq/bin/activate*

# -------------------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
LABEL io.cronoq.stage=runtime
# Images that carry a system-wide pip (the official ones) lose it: nothing is installed later.
RUN set -eux; \
    if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip uninstall --yes --root-user-action=ignore pip setuptools wheel || true; \
    fi; \
    groupadd --system --gid 10001 cronoq; \
    useradd --system --uid 10001 --gid cronoq --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin cronoq
COPY --from=build /opt/cronoq /opt/cronoq
COPY deploy/cronoq.example.toml /etc/cronoq/cronoq.toml
ENV PATH=/opt/cronoq/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CRONOQ_CONFIG=/etc/cronoq/cronoq.toml \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so that Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
# gRPC, HTTP (JSON API, /metrics with a token, /healthz, /readyz).
EXPOSE 7070 7071
ENTRYPOINT ["cronoq-server"]
