"""Layers, OCI layouts and docker-save archives, and the base roots images start from."""
