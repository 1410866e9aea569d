# syntax=docker/dockerfile:1
# nightshift container image: a release build of the one binary on a distroless base.
#
#   docker build -t registry.example.com/nightshift/nightshift:0.1.0 .
#
# Build stage: the toolchain the crate requires (rust-version 1.95). aws-lc-rs (the TLS crypto
# provider) compiles C code with the compiler and cmake this image already has; protox compiles
# the KEDA proto in build.rs, so no protoc is needed.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds (BuildKit); the binary is copied
# out of the cached target dir because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin nightshift \
    && install -D -m 0755 target/release/nightshift /out/nightshift

# Runtime stage: glibc and libgcc only (what a Rust binary with aws-lc needs), no shell, no
# package manager, CA certificates included. The "nonroot" tag runs as UID/GID 65532, which the
# Deployment's securityContext also requires.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/nightshift /usr/local/bin/nightshift
USER 65532:65532
# gRPC scaler, webhook (HTTPS), admin (health, metrics, status).
EXPOSE 6000 8443 8080
ENTRYPOINT ["/usr/local/bin/nightshift"]
CMD ["run"]
