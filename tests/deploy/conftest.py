"""tests/deploy reuses the real control plane of tests/kube (etcd + kube-apiserver)."""

from tests.kube.fixtures import admin, kube

__all__ = ["admin", "kube"]
