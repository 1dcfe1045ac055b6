"""Real container engines for the tests: a private dockerd, and a running `execwatch trace`."""
