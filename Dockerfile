# The operator image: a static (musl) egress-proxies binary on a distroless base.
#   docker build -t egress-proxies:0.1.0 --build-arg GIT_COMMIT=$(git rev-parse --short HEAD) .
# Stage 1 builds on Alpine, whose native Rust target is x86_64-unknown-linux-musl: the binary
# is statically linked by default (crt-static), so it needs no libc at run time.
FROM rust:1-alpine AS build
# C toolchain, cmake and perl: ring and aws-lc-sys (TLS and SSH crypto) compile C code.
RUN apk add --no-cache build-base cmake perl
WORKDIR /src
COPY . .
ARG GIT_COMMIT=unknown
ENV EGRESS_PROXIES_GIT_COMMIT=${GIT_COMMIT}
RUN cargo build --release --locked -p egress-proxies \
 && cp target/release/egress-proxies /egress-proxies \
 && ! ldd /egress-proxies 2>/dev/null | grep -q "=>"

# Stage 2: no shell, no package manager; runs as uid 65532 (the chart's runAsUser).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /egress-proxies /usr/local/bin/egress-proxies
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/egress-proxies"]
CMD ["kubernetes", "--config=/etc/egress-proxies/config/providers.yaml"]
