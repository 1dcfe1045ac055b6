"""The Helm chart rendered as the tests and benchmarks install it."""
