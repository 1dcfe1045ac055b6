"""One real Kubernetes node on this machine (kubelet, containerd, the chart installed by
helm) and the images and workloads it runs."""
