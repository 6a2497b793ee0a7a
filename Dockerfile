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
RUN go build -ldflags="-s -w" -o /out/replayguard ./cmd/server

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/replayguard /replayguard
# nonroot is uid/gid 65532 in distroless images.
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/replayguard"]
