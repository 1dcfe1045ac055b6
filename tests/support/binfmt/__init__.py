"""Executables to run and parse: C built with the host's compilers, ELF files built byte by
byte (well formed or hostile), foreign architectures and operating systems, and a
binfmt_misc table of its own with QEMU registered."""
