"""A real registry (with token auth), its fixtures, and proxies in front of it."""
