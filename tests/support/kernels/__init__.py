"""Real Debian kernels booted under QEMU."""
