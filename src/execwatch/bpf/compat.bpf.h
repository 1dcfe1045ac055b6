/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Kernel-version differences, in one place. Each helper picks its way when the
 * program is loaded: libbpf resolves the CO-RE checks below against the running
 * kernel's BTF to constants, and the verifier never visits the branch that calls a
 * helper the kernel lacks. Include after the task_struct and pt_regs declarations.
 * Supported: Linux 5.10 and later (tests/kernels boots each kernel of the matrix). */
#ifndef EXECWATCH_COMPAT_H
#define EXECWATCH_COMPAT_H

/* task_pt_regs(): the registers saved at syscall entry sit at the top of the task's
 * kernel stack, THREAD_SIZE bytes: 16 KiB on x86_64 and on arm64 with 4 KiB pages
 * (KASAN kernels double it). Only used where bpf_task_pt_regs is missing (< 5.15). */
#define EW_THREAD_SIZE (16 * 1024)

/* The current task. bpf_get_current_task_btf is 5.11+. Before it, the untyped
 * bpf_get_current_task: every read of the task goes through CO-RE probe reads anyway. */
static __always_inline struct task_struct *current_task(void)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf))
		return bpf_get_current_task_btf();
	return (struct task_struct *)bpf_get_current_task();
}

/* The current syscall's user registers, for its arguments at syscall exit (nothing is
 * stored at entry, so a successful exec costs nothing more). bpf_task_pt_regs is 5.15+. */
static __always_inline struct pt_regs *syscall_regs(struct task_struct *task)
{
	char *stack;

	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs))
		return (struct pt_regs *)bpf_task_pt_regs(task);
	stack = BPF_CORE_READ(task, stack);
	return (struct pt_regs *)(stack + EW_THREAD_SIZE - bpf_core_type_size(struct pt_regs));
}

/* An argument of the current syscall from syscall_regs(): bpf_task_pt_regs' result is a
 * BTF pointer (5.15+), read with a plain load that faults safely to 0; the computed one
 * before it needs a probe read. On the exec failure path of every PATH-search miss. */
#define syscall_arg(regs, PARM)                                                         \
	(bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)            \
		 ? (unsigned long)PT_REGS_##PARM##_SYSCALL(regs)                          \
		 : (unsigned long)PT_REGS_##PARM##_CORE_SYSCALL(regs))

/* The caller's cgroup v2 id, as bpf_get_current_cgroup_id() reads it: plain loads through
 * the BTF-typed task (5.11+), one helper call less on every failure. Needs css_set, cgroup
 * and kernfs_node declared. */
static __always_inline __u64 current_cgroup_id(void)
{
	struct task_struct *task;

	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf)) {
		task = bpf_get_current_task_btf();
		return task->cgroups->dfl_cgrp->kn->id;
	}
	return bpf_get_current_cgroup_id();
}

/* The caller's mount namespace and root directory inode: what keeps two roots apart. With
 * the BTF-typed task (5.11+) these are plain loads, faulting safely to 0; before, one probe
 * read per pointer. Needs nsproxy, mnt_namespace, fs_struct, dentry and inode declared. */
static __always_inline void caller_root(struct task_struct *task, __u64 *mntns, __u64 *root_ino)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf)) {
		task = bpf_get_current_task_btf();
		*mntns = task->nsproxy->mnt_ns->ns.inum;
		*root_ino = task->fs->root.dentry->d_inode->i_ino;
		return;
	}
	*mntns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
	*root_ino = BPF_CORE_READ(task, fs, root.dentry, d_inode, i_ino);
}

#endif
