# The operator image. The supported way to build it is scripts/build-image, which needs no
# base image and no registry (none is reachable where this project is built and tested): it
# puts the release binary, the shared libraries `ldd` lists for it, the CA bundle and a
# nonroot user (65532) into a root filesystem and assembles an OCI image with umoci:
#   scripts/build-image            # -> target/image/egress-proxies-0.1.0.oci.tar (+ oci/, rootfs/)
#   skopeo copy oci-archive:target/image/egress-proxies-0.1.0.oci.tar \
#     docker://REGISTRY/egress-proxies:0.1.0
# crates/egress-proxies/tests/image.rs builds it that way and runs it as the chart does
# (read-only root, uid 65532).
#
# This Dockerfile builds the same image with Docker or Podman from the root filesystem the
# script leaves in target/image/rootfs (no base image needed either):
#   scripts/build-image && docker build -f Dockerfile -t egress-proxies:0.1.0 target/image
FROM scratch
COPY rootfs/ /
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/egress-proxies"]
CMD ["kubernetes", "--config=/etc/egress-proxies/config/providers.yaml"]
