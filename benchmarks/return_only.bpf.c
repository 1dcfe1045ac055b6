// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The baseline for benchmarks/probe_bench.py: a program that only returns, on the same
 * tracepoint as execwatch's exec program, so both pay the same dispatch cost. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("tracepoint/syscalls/sys_exit_execve")
int return_only(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
