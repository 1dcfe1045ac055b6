"""Attribution: which container, pod and workload a failed exec came from."""
