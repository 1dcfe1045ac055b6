"""The cluster pipeline: node agents publish ExecFailure records, one leader-elected
handler turns them into pod Events, pod labels and Prometheus metrics.

The API server is the queue between them, so agents need one permission (create records
in one namespace) and every write to pods happens in one place.
"""
