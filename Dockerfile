# syntax=docker/dockerfile:1
#
# Replayguard server image: a static binary on distroless, running as a
# non-root user. Build with: docker build -t replayguard .
# Configure it with REPLAYGUARD_* variables (see README.md); secrets can
# come from files instead (REPLAYGUARD_SIGNING_KEYS_FILE and friends).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"
# Dependencies first, so they are cached until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# grpcnotrace leaves gRPC's debug pages (golang.org/x/net/trace) out of
# the OTLP/gRPC exporter: 12 MB less binary, nothing lost. nomsgpack
# leaves out Gin's MessagePack codec (github.com/ugorji/go), which nothing
# here uses: 6 MB less. Both are optional; `go run ./cmd/server` builds
# without them. cmd/server/deps_test.go checks them.
RUN go build -tags grpcnotrace,nomsgpack -ldflags="-s -w" -o /out/replayguard ./cmd/server

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/replayguard /replayguard
# nonroot is uid/gid 65532 in distroless images.
USER nonroot:nonroot
# The server listens on every interface in the container: without this,
# a server with neither signing keys nor API keys (a development setup)
# would listen on the container's loopback only, out of reach.
ENV REPLAYGUARD_ADDR=:8080
EXPOSE 8080
# No shell or curl in distroless: the binary probes its own /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/replayguard", "-healthcheck"]
ENTRYPOINT ["/replayguard"]
