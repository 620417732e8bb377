# syntax=docker/dockerfile:1
# kvgate as a container image: docker build -t kvgate:0.1.0 .
#
# Two stages: the release build on the official Rust image, then the binary
# alone on Debian slim (the same Debian release, so the glibc matches). The
# Qwen3 tokenizer under assets/tokenizers/qwen3 is compiled into the binary
# (include_bytes! in kvgate-tokenize), and so is the dashboard; the image
# downloads nothing at run time. For another model's tokenizer, mount its
# directory and pass --model-dir. docs/deploy.md explains the ports and flags.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and the target directory between builds
# (BuildKit); the binary is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p kvgate --locked \
    && cp target/release/kvgate /usr/local/bin/kvgate

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 kvgate \
    && useradd --system --uid 10001 --gid kvgate --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin kvgate
COPY --from=build /usr/local/bin/kvgate /usr/local/bin/kvgate
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
# 8000: the OpenAI-compatible API, /health, /ready, /metrics (--listen).
# 8001: the admin API and dashboard (--admin-listen; loopback by default).
# 9000: the peer endpoint between kvgate instances (--peer-listen).
# 9002: the endpoint picker's gRPC (`kvgate epp --listen`).
# kvgate listens on 127.0.0.1 unless told otherwise: pass --listen 0.0.0.0:8000
# (with --api-key, or --allow-unauthenticated) to publish the API.
EXPOSE 8000 8001 9000 9002
ENTRYPOINT ["kvgate"]
CMD ["serve"]
