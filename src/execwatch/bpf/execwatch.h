/* SPDX-License-Identifier: Apache-2.0 */
/* Layout shared by the BPF program and user space (src/execwatch/probe/layout.py).
 * Change both together: tests/test_layout.py compiles this header and compares. */
#ifndef EXECWATCH_H
#define EXECWATCH_H

#define EW_TASK_COMM_LEN 16
#define EW_PATH_LEN 256
#define EW_CGROUP_NAME_LEN 128
#define EW_DPATH_LEN 256 /* a path rebuilt from the dentry chain */

/* ew_event.path_flags */
#define EW_ROOT_PATH_OK 0x1 /* root_path is whole: it reaches its mount namespace's root */
#define EW_BASE_SET 0x2     /* the base_* fields are filled */
#define EW_BASE_IN_ROOT 0x4 /* base_path is whole and inside the caller's root */

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
	/* What finds the caller's root and the file once the caller is gone. Paths come
	 * from the dentry chain, leaf first: "c/b/a/" is /a/b/c (no lookup in BPF). */
	__u64 root_dev;       /* the root directory's s_dev (kernel encoding) */
	__u64 base_dev;       /* the base: for AT_EMPTY_PATH the file itself; else the */
	__u64 base_ino;       /* directory a relative name resolves against (dirfd or cwd) */
	__u32 root_mnt_id;
	__u32 base_mnt_id;
	__u32 path_flags;     /* EW_ROOT_PATH_OK | EW_BASE_SET | EW_BASE_IN_ROOT */
	__u32 pad;
	char root_path[EW_DPATH_LEN]; /* the root's path in its mount namespace */
	char base_path[EW_DPATH_LEN]; /* the base's path inside the caller's root */
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
