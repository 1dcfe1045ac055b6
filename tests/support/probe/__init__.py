"""The BPF probe in a thread, Debian roots to run programs in, and programs that die early."""
