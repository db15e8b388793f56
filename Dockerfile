# One image per failbus binary: docker build --build-arg SERVICE=classifier .
FROM golang:1.26 AS build
ARG SERVICE=failbus
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/app ./cmd/${SERVICE}

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/app /app
ENTRYPOINT ["/app"]
