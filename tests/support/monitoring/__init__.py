"""A real Prometheus on loopback."""
