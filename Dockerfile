# gorgo: one static binary on a distroless base, run as non-root.
#   docker build -t gorgo .
#   docker run --rm -p 8080:8080 -p 9091:9091 -v $PWD/examples:/etc/gorgo gorgo serve --config /etc/gorgo/serve.yaml
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/gorgo ./cmd/gorgo

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gorgo /gorgo
USER nonroot:nonroot
EXPOSE 8080 9091 9002
ENTRYPOINT ["/gorgo"]
CMD ["serve", "--config", "/etc/gorgo/serve.yaml"]
