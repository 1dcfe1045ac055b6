/* SPDX-License-Identifier: Apache-2.0 */
/* Layout shared by the BPF program and user space (src/execwatch/probe/layout.py).
 * Change both together: tests/test_layout.py compiles this header and compares. */
#ifndef EXECWATCH_H
#define EXECWATCH_H

#define EW_TASK_COMM_LEN 16
#define EW_PATH_LEN 256
#define EW_CGROUP_NAME_LEN 128

enum ew_syscall {
	EW_EXECVE = 0,
	EW_EXECVEAT = 1,
};

/* Load-time knobs: the program's only .rodata variable. */
struct ew_config {
	__u64 wakeup_interval_ns; /* wake user space at most this often per CPU */
	__u32 all_errnos;         /* 1: report every failure, not just the exec-relevant errnos */
	__u32 pad;
};

struct ew_event {
	__u64 ktime_ns;       /* bpf_ktime_get_boot_ns() */
	__u64 cgroup_id;      /* cgroup v2 inode of the caller */
	__u64 cgroup_parent_id; /* its parent's: a pod's cgroup outlives its containers' */
	__u64 mntns;          /* mount namespace inode of the caller */
	__u64 root_ino;       /* inode of the caller's root directory (chroot/pivot_root) */
	__s32 err;            /* positive errno */
	__u32 pid;            /* thread id */
	__u32 tgid;
	__u32 ppid;           /* parent tgid */
	__u32 uid;
	__s32 dirfd;          /* execveat only */
	__u32 flags;          /* execveat only (AT_EMPTY_PATH: fexecve) */
	__u32 syscall;        /* enum ew_syscall */
	char comm[EW_TASK_COMM_LEN];
	char parent_comm[EW_TASK_COMM_LEN];
	char filename[EW_PATH_LEN];
	char fd_name[EW_TASK_COMM_LEN * 4]; /* basename behind dirfd when AT_EMPTY_PATH */
	char cgroup_name[EW_CGROUP_NAME_LEN]; /* the cgroup directory's own name */
};

struct ew_count_key {
	__u64 cgroup_id;
	__s32 err;
	__u32 pad;
};

enum ew_stat {
	EW_STAT_RINGBUF_DROPS = 0,  /* ring buffer full: event lost, counters still exact */
	EW_STAT_COUNTER_FULL = 1,   /* counts map full: counted in the overflow key instead */
	EW_STAT_MAX = 2,
};

#endif
