"""The Kubernetes client layer: one JSON client (`client`), one error taxonomy
(`errors`), watch, workqueue, lease, and text made safe for the API server (`safe`).
Nothing here knows execwatch's records or pods: agent, handler, placement and audit build
on it."""
