// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Failed-exec probe. Only the syscall-exit tracepoints are hooked, so a
 * successful exec costs one load and one compare; everything else happens
 * on the failure path. No vmlinux.h: the few kernel types read here are
 * declared below and relocated by CO-RE against the running kernel's BTF. */
#define __VMLINUX_H__ /* kernel register names in bpf_tracing.h */
#include <linux/types.h>
#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "execwatch.h"

#define ENOENT 2
#define ENOEXEC 8
#define EACCES 13
#define ELIBBAD 80
#define AT_EMPTY_PATH 0x1000
#define MAX_ERRNO 256

#if defined(__TARGET_ARCH_x86)
struct pt_regs { long di, si, dx, r10, r8; } __attribute__((preserve_access_index));
#elif defined(__TARGET_ARCH_arm64)
struct user_pt_regs { __u64 regs[31]; } __attribute__((preserve_access_index));
struct pt_regs { struct user_pt_regs user_regs; } __attribute__((preserve_access_index));
#endif

struct qstr { const unsigned char *name; } __attribute__((preserve_access_index));
struct inode { unsigned long i_ino; } __attribute__((preserve_access_index));
struct dentry { struct qstr d_name; struct inode *d_inode; } __attribute__((preserve_access_index));
struct path { struct dentry *dentry; } __attribute__((preserve_access_index));
struct fs_struct { struct path root; } __attribute__((preserve_access_index));
struct file { struct path f_path; } __attribute__((preserve_access_index));
struct fdtable { unsigned int max_fds; struct file **fd; } __attribute__((preserve_access_index));
struct files_struct { struct fdtable *fdt; } __attribute__((preserve_access_index));
struct ns_common { unsigned int inum; } __attribute__((preserve_access_index));
struct mnt_namespace { struct ns_common ns; } __attribute__((preserve_access_index));
struct nsproxy { struct mnt_namespace *mnt_ns; } __attribute__((preserve_access_index));
/* kernfs_node::parent became __parent in Linux 6.15: one flavor for each. */
struct kernfs_node {
	const char *name;
	__u64 id;
} __attribute__((preserve_access_index));
struct kernfs_node___new { struct kernfs_node *__parent; } __attribute__((preserve_access_index));
struct kernfs_node___old { struct kernfs_node *parent; } __attribute__((preserve_access_index));
struct cgroup { struct kernfs_node *kn; } __attribute__((preserve_access_index));
struct css_set { struct cgroup *dfl_cgrp; } __attribute__((preserve_access_index));
struct task_struct {
	void *stack;
	int tgid;
	char comm[EW_TASK_COMM_LEN];
	struct task_struct *real_parent;
	struct nsproxy *nsproxy;
	struct files_struct *files;
	struct fs_struct *fs;
	struct css_set *cgroups;
} __attribute__((preserve_access_index));

#include "compat.bpf.h"

/* Syscall exit tracepoint context: see events/syscalls/sys_exit_execve/format. */
struct sys_exit_ctx {
	__u64 common;
	int syscall_nr;
	long ret;
};

const volatile struct ew_config cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized at load time */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ew_count_key);
	__type(value, __u64);
} counts SEC(".maps");

/* Per-errno totals: an array never fills, so these stay exact whatever happens. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_ERRNO);
	__type(key, __u32);
	__type(value, __u64);
} errno_totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EW_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct wakeup {
	__u64 time;
	__u64 cgroup_id;
};

/* Per CPU: when the consumer was last woken, and for which cgroup. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wakeup);
} last_wakeup SEC(".maps");

static __always_inline void bump(void *map, const void *key)
{
	__u64 *v = bpf_map_lookup_elem(map, key);

	if (v)
		*v += 1; /* per-CPU value: no atomic needed */
}

static __always_inline void count(__u64 cgroup_id, int err)
{
	struct ew_count_key key = { .cgroup_id = cgroup_id, .err = err };
	__u32 idx = err;
	__u64 one = 1;

	bump(&errno_totals, &idx);
	__u64 *v = bpf_map_lookup_elem(&counts, &key);
	if (v) {
		*v += 1;
	} else if (bpf_map_update_elem(&counts, &key, &one, BPF_NOEXIST)) {
		idx = EW_STAT_COUNTER_FULL;
		bump(&stats, &idx);
	}
}

/* A wakeup is an irq_work (a self-IPI in VMs) costing microseconds. A storm from one
 * cgroup wakes the consumer once per interval; it polls with a timeout and collects the
 * rest. A failure from another cgroup wakes it at once: a dying container's rootfs is
 * only there for a few milliseconds, and the diagnosis needs it. */
static __always_inline __u64 wakeup_flag(__u64 now, __u64 cgroup_id)
{
	__u32 zero = 0;
	struct wakeup *last = bpf_map_lookup_elem(&last_wakeup, &zero);

	if (!last)
		return BPF_RB_FORCE_WAKEUP;
	if (now - last->time >= cfg.wakeup_interval_ns || cgroup_id != last->cgroup_id) {
		last->time = now;
		last->cgroup_id = cgroup_id;
		return BPF_RB_FORCE_WAKEUP;
	}
	return BPF_RB_NO_WAKEUP;
}

static __always_inline bool reported(int err)
{
	return cfg.all_errnos || err == ENOEXEC || err == ENOENT || err == EACCES || err == ELIBBAD;
}

static __always_inline void read_fd_name(struct task_struct *task, int fd, char *dst, __u32 len)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds;
	struct file *f;

	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return;
	bpf_probe_read_kernel_str(dst, len, BPF_CORE_READ(f, f_path.dentry, d_name.name));
}

/* The cgroup's name and parent id let user space rebuild its path even when the cgroup
 * was created and removed before anyone listed it (a container that dies at once). */
static __always_inline void read_cgroup(struct task_struct *task, struct ew_event *e)
{
	struct kernfs_node *kn = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn);
	struct kernfs_node *parent;

	if (bpf_core_field_exists(((struct kernfs_node___new *)0)->__parent))
		parent = BPF_CORE_READ((struct kernfs_node___new *)kn, __parent);
	else
		parent = BPF_CORE_READ((struct kernfs_node___old *)kn, parent);
	e->cgroup_parent_id = parent ? BPF_CORE_READ(parent, id) : 0;
	if (bpf_probe_read_kernel_str(e->cgroup_name, sizeof(e->cgroup_name), BPF_CORE_READ(kn, name)) < 0)
		e->cgroup_name[0] = 0;
}

/* Not inlined: the success path then runs in a program with no stack frame to set up. */
static __noinline int on_failure(long ret, enum ew_syscall sc)
{
	struct task_struct *task;
	struct pt_regs *regs;
	struct ew_event *e;
	__u64 cgroup_id;
	const char *name;
	__u32 idx;

	cgroup_id = bpf_get_current_cgroup_id();
	count(cgroup_id, (int)-ret);
	if (!reported((int)-ret))
		return 0;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		idx = EW_STAT_RINGBUF_DROPS;
		bump(&stats, &idx);
		return 0;
	}
	task = current_task();
	regs = syscall_regs(task);
	__u64 id = bpf_get_current_pid_tgid();

	e->ktime_ns = bpf_ktime_get_boot_ns();
	e->cgroup_id = cgroup_id;
	e->mntns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
	e->root_ino = BPF_CORE_READ(task, fs, root.dentry, d_inode, i_ino);
	read_cgroup(task, e);
	e->err = (int)-ret;
	e->pid = (__u32)id;
	e->tgid = id >> 32;
	e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->syscall = sc;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	BPF_CORE_READ_STR_INTO(&e->parent_comm, task, real_parent, comm);
	e->fd_name[0] = 0;
	if (sc == EW_EXECVEAT) {
		e->dirfd = (int)PT_REGS_PARM1_CORE_SYSCALL(regs);
		name = (const char *)PT_REGS_PARM2_CORE_SYSCALL(regs);
		e->flags = (__u32)PT_REGS_PARM5_CORE_SYSCALL(regs);
	} else {
		e->dirfd = -100; /* AT_FDCWD */
		name = (const char *)PT_REGS_PARM1_CORE_SYSCALL(regs);
		e->flags = 0;
	}
	if (bpf_probe_read_user_str(e->filename, sizeof(e->filename), name) < 0)
		e->filename[0] = 0;
	if (sc == EW_EXECVEAT && (e->flags & AT_EMPTY_PATH) && !e->filename[0])
		read_fd_name(task, e->dirfd, e->fd_name, sizeof(e->fd_name));
	bpf_ringbuf_submit(e, wakeup_flag(e->ktime_ns, cgroup_id));
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_execve")
int exit_execve(struct sys_exit_ctx *ctx)
{
	return ctx->ret < 0 ? on_failure(ctx->ret, EW_EXECVE) : 0;
}

SEC("tracepoint/syscalls/sys_exit_execveat")
int exit_execveat(struct sys_exit_ctx *ctx)
{
	return ctx->ret < 0 ? on_failure(ctx->ret, EW_EXECVEAT) : 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
