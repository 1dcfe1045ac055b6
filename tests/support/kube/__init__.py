"""A real control plane (etcd, kube-apiserver, kwok) and execwatch processes run against it."""
