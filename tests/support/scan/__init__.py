"""`execwatch scan` run as the CLI does, and hostile scan inputs."""
