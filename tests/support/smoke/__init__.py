"""The cases of `execwatch scan --run` (issue 37), shared by the host and the guest tests."""
