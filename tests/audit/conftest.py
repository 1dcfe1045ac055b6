"""A real API server (tests/kube) and a real registry (tests/registry) for the audit tests."""

from tests.kube.fixtures import admin, kube
from tests.registry.conftest import clean_home
from tests.registry.fixtures import pushed, registry
from tests.scan.conftest import built, host_glibc, host_musl

__all__ = ["admin", "built", "clean_home", "host_glibc", "host_musl", "kube", "pushed", "registry"]
