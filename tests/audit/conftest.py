"""A real API server (tests/kube) and a real registry (tests/registry) for the audit tests."""

from tests.registry.conftest import clean_home
from tests.scan.conftest import built, host_glibc, host_musl
from tests.support.kube.apiserver_fixtures import admin, kube
from tests.support.registry.registry_fixtures import pushed, registry

__all__ = ["admin", "built", "clean_home", "host_glibc", "host_musl", "kube", "pushed", "registry"]
