"""Fixtures for the prometheus-operator tests: a real API server (tests/kube)."""

from tests.kube.fixtures import kube

__all__ = ["kube"]
