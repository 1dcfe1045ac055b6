"""Fixtures for the prometheus-operator tests: a real API server (tests/kube)."""

from tests.support.kube.apiserver_fixtures import kube

__all__ = ["kube"]
