"""The node agent (DaemonSet): the node stack into a publisher that creates ExecFailure
records, rate-limited, aggregated and spooled across restarts."""
