# Build and run execwatch. `make trace` and `make test` are the two entry points
# (see README.md); both set the machine up first.
ARCH ?= $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
MULTIARCH ?= $(shell gcc -print-multiarch 2>/dev/null || echo $(shell uname -m)-linux-gnu)
BPF_DIR := src/execwatch/bpf
BPF_OBJ := $(BPF_DIR)/execwatch.bpf.o
# The microVM's init for `scan --run --cpu-level` (smoke/microvm.py): static, musl when there.
GUEST_DIR := src/execwatch/smoke/guest
GUEST_INIT := $(GUEST_DIR)/execwatch-init
GUEST_CC ?= $(shell command -v musl-gcc 2>/dev/null || echo gcc)
PYTEST_ARGS ?=

.PHONY: setup setup-test bpf guest-init trace test bench lint
setup:
	dev/setup.sh

setup-test:
	dev/setup.sh --test

bpf: $(BPF_OBJ)

$(BPF_OBJ): $(BPF_DIR)/execwatch.bpf.c $(BPF_DIR)/execwatch.h $(BPF_DIR)/compat.bpf.h
	clang -g -O2 -Wall -Werror -target bpf -D__TARGET_ARCH_$(ARCH) \
		-I/usr/include/$(MULTIARCH) -I$(BPF_DIR) -c $< -o $@

guest-init: $(GUEST_INIT)

$(GUEST_INIT): $(GUEST_DIR)/init.c
	$(GUEST_CC) -static -Os -s -Wall -Wextra -Werror -Wno-unused-result -o $@ $<

trace: setup
	.venv/bin/execwatch trace $(TRACE_ARGS)

# The Go tools build in the background while the tests that need none run (dev/test.sh).
test:
	dev/test.sh $(PYTEST_ARGS)

bench: setup-test
	.venv/bin/python -m benchmarks $(BENCH_ARGS)

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
