"""Fixtures for tests that need a real API server; see fixtures.py."""

from tests.support.kube.apiserver_fixtures import (
    admin,
    agent_api,
    agent_rest,
    handler_api,
    handler_kube,
    kube,
)

__all__ = ["admin", "agent_api", "agent_rest", "handler_api", "handler_kube", "kube"]
