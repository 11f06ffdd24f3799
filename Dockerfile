# An image that holds only the gotrain binary, to copy from. A training
# image needs one line:
#
#   COPY --from=gotrain /gotrain /usr/local/bin/gotrain
#
# Build it:
#
#   docker build -t gotrain .                  # builds gotrain in a Go image
#   make release-bin && docker build --build-arg BINARY_FROM=prebuilt -t gotrain .
#                                              # or ships the one make built here
#
# The binary links glibc (cgo, for NVML): the image it is copied into needs
# glibc ≥ 2.34 where it was built on Debian 12 (CUDA and PyTorch images on
# Ubuntu 22.04 or newer have it).

ARG GO_IMAGE=golang:1.26-bookworm
ARG BINARY_FROM=build

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY . .
RUN make release-bin && cp bin/release/linux_"$(go env GOARCH)"/gotrain /gotrain

FROM scratch AS prebuilt
COPY bin/release/linux_amd64/gotrain /gotrain

FROM ${BINARY_FROM} AS binary

FROM scratch
COPY --from=binary /gotrain /gotrain
ENTRYPOINT ["/gotrain"]
