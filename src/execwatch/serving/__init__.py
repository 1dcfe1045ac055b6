"""What every port execwatch opens shares: the bounded HTTP/1.1 server, the metrics
exposition and its health checks, authenticated scrapes, TLS certificates."""
