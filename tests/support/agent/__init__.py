"""ExecFailure values as the probe and attribution hand them to the agent's publisher."""
