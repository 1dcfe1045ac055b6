"""What several test packages and the benchmarks share, one folder per concern
(tests/support/<concern>/<name>.py, each file name its own) and the one wait of the suite
(wait.py). The benchmarks import test code only from here, and nothing here imports a test
module (tests/test_layout.py)."""
