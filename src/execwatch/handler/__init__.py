"""The leader-elected handler: ExecFailure records into pod Events, pod labels and
Prometheus metrics. The API server is the queue between agents and the handler, so agents
need one permission (create records in one namespace) and every write to pods happens here."""
