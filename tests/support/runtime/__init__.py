"""Container runtimes as the tests run them: containerd with its CRI plugin, and runc."""
