# syntax=docker/dockerfile:1.7
# The agentbox image: static (musl) release binaries of the operator, the egress proxy
# (agentbox-proxy, run as its own Deployment from this image), the node-side helper
# (agentbox-helper, which the operator runs in its node-side pods: the chart's default
# --helper-image is this image) and, when present, the CLI (also as kubectl-agentbox) and
# agentbox-selftest (what the chart's `helm test` pod runs), on a distroless base that has CA
# certificates, no shell, and runs as a non-root user.
#
#   docker build -t agentbox/operator:0.1.0 .
#
# (The local test cluster has no container engine: hack/image assembles an equivalent image from
# a static glibc build with hack/mkimage instead.)

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-alpine AS build
# musl-dev: the C runtime that ring's and the linker's static musl build needs.
RUN apk add --no-cache musl-dev
WORKDIR /src
# The whole source tree (see .dockerignore): Cargo checks that every declared target (benches
# too) exists, even those it does not build.
COPY . .
# The commit agentbox_build_info reports: docker build --build-arg GIT_COMMIT=$(git rev-parse --short=12 HEAD)
ARG GIT_COMMIT=unknown
ENV AGENTBOX_GIT_COMMIT=${GIT_COMMIT}
# On Alpine the host target is x86_64/aarch64-unknown-linux-musl: binaries are static by default.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
 && mkdir -p /out \
 && for b in agentbox-operator agentbox-helper agentbox-proxy agentbox kubectl-agentbox agentbox-selftest; do \
      if [ -f "target/release/$b" ]; then cp "target/release/$b" /out/; fi; \
    done \
 && test -x /out/agentbox-operator && test -x /out/agentbox-helper

# distroless static: CA certificates, /etc/passwd with "nonroot" (65532), tzdata, nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/agentbox-operator"]
