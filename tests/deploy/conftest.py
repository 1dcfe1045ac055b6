"""tests/deploy reuses the real control plane of tests/kube (etcd + kube-apiserver)."""

from tests.support.kube.apiserver_fixtures import admin, kube

__all__ = ["admin", "kube"]
