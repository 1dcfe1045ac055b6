/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Kernel-version differences, in one place. Each helper below picks its way when the
 * program is loaded: libbpf resolves the CO-RE checks against the running kernel's BTF
 * to constants, and the verifier never visits the branch that calls a helper the kernel
 * lacks. Include after the task_struct, pt_regs and kernfs_node declarations.
 *
 * The kernel versions, the one table of them: what, the first release with it, the
 * upstream change. probe/loader.py reads its rows (probe.loader.KERNEL) for its feature
 * checks and their messages; the code below and the docs name a row, not a version.
 *
 * | what                      | since | change                                                                 |
 * | supported                 | 5.10  | the oldest kernel tests/kernels boots (Debian bullseye), each newer one of its matrix too |
 * | bpf_get_current_cgroup_id | 4.18  | bf6fa2c893c5 ("bpf: implement bpf_get_current_cgroup_id() helper")     |
 * | bpf_probe_read_user_str   | 5.5   | 6ae08ae3dea2 ("bpf: Add probe_read_{user, kernel} and probe_read_{user, kernel}_str helpers") |
 * | bpf_probe_read_kernel_str | 5.5   | 6ae08ae3dea2 (the same)                                                 |
 * | BPF_MAP_TYPE_RINGBUF      | 5.8   | 457f44363a88 ("bpf: Implement BPF ring buffer and verifier support for it") |
 * | bpf_ktime_get_boot_ns     | 5.8   | 71d19214776e ("bpf: add bpf_ktime_get_boot_ns()")                      |
 * | bpf_get_current_task_btf  | 5.11  | 3ca1032ab7ab ("bpf: Implement get_current_task_btf and RET_PTR_TO_BTF_ID") |
 * | memcg_accounting          | 5.11  | the series "bpf: switch to memcg-based memory accounting": maps charged to the cgroup, not to RLIMIT_MEMLOCK |
 * | variable_offset_stack     | 5.12  | 01f810ace9ed ("bpf: Allow variable-offset stack access")               |
 * | atomic_cmpxchg            | 5.12  | 5ffa25502b5a ("bpf: Add instructions for atomic_[cmp]xchg")            |
 * | bpf_task_pt_regs          | 5.15  | dd6e10fbd9fb ("bpf: Add bpf_task_pt_regs() helper")                    |
 * | kernfs_node___parent      | 6.15  | 633488947ef6 ("kernfs: Use RCU to access kernfs_node::parent.")        |
 * | tp_btf                    | 5.5   | 9e15db66136a ("bpf: Implement accurate raw_tp context access via BTF") |
 * | linux_binprm_interpreter  | 5.8   | bc2bf338d54b ("exec: Remove recursion from search_binary_handler")     |
 * | bprm_change_interp        | 3.8   | b66c59840175 ("exec: do not leave bprm->interp on stack")              |
 *
 * One difference shapes code rather than picking a branch: without variable_offset_stack
 * the verifier refuses a stack access at a variable offset, so loops that index the stack
 * are unrolled. Another is the cgroup budget (ew_budget): without atomic_cmpxchg, and
 * since a tracing program may not take a bpf_spin_lock, its arrival time is a plain load
 * and store, and its shed count an add whose result is unused (BPF_XADD, as old as eBPF's
 * maps). */
#ifndef EXECWATCH_COMPAT_H
#define EXECWATCH_COMPAT_H

/* bpf_get_current_task_btf (the table above). Its task is BTF-typed: reads through it
 * are plain loads that fault safely to 0, where the untyped task needs a probe read per
 * pointer. */
#define EW_HAVE_TASK_BTF bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf)

/* bpf_task_pt_regs (the table above). */
#define EW_HAVE_TASK_PT_REGS bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)

/* task_pt_regs(): the registers saved at syscall entry sit at the top of the task's
 * kernel stack, THREAD_SIZE bytes: 16 KiB on x86_64 and on arm64 with 4 KiB pages
 * (KASAN kernels double it). Only used where bpf_task_pt_regs is missing. */
#define EW_THREAD_SIZE (16 * 1024)

/* The current task: BTF-typed with bpf_get_current_task_btf, else the untyped bpf_get_current_task (every
 * read of the task below then goes through a CO-RE probe read). */
static __always_inline struct task_struct *current_task(void)
{
	if (EW_HAVE_TASK_BTF)
		return bpf_get_current_task_btf();
	return (struct task_struct *)bpf_get_current_task();
}

/* The current syscall's user registers, for its arguments at syscall exit (nothing is
 * stored at entry, so a successful exec costs nothing more): bpf_task_pt_regs where the
 * kernel has it, else computed from the stack as task_pt_regs() does. */
static __always_inline struct pt_regs *syscall_regs(struct task_struct *task)
{
	char *stack;

	if (EW_HAVE_TASK_PT_REGS)
		return (struct pt_regs *)bpf_task_pt_regs(task);
	stack = BPF_CORE_READ(task, stack);
	return (struct pt_regs *)(stack + EW_THREAD_SIZE - bpf_core_type_size(struct pt_regs));
}

/* An argument of the current syscall from syscall_regs(): bpf_task_pt_regs' result is a
 * BTF pointer, read with a plain load that faults safely to 0; the
 * computed one before it needs a probe read. On the exec failure path of every
 * PATH-search miss. */
#define syscall_arg(regs, PARM)                                                         \
	(EW_HAVE_TASK_PT_REGS ? (unsigned long)PT_REGS_##PARM##_SYSCALL(regs)            \
			      : (unsigned long)PT_REGS_##PARM##_CORE_SYSCALL(regs))

/* The user instruction pointer saved at syscall entry, from syscall_regs(), read the same
 * two ways as syscall_arg. On the early-death path only. */
#define syscall_ip(regs)                                                                 \
	(EW_HAVE_TASK_PT_REGS ? (unsigned long)PT_REGS_IP(regs) : (unsigned long)PT_REGS_IP_CORE(regs))

/* The caller's cgroup v2 id, as bpf_get_current_cgroup_id() reads it: with the BTF-typed
 * task (bpf_get_current_task_btf), plain loads instead of a helper call on every failure. */
static __always_inline __u64 current_cgroup_id(struct task_struct *task)
{
	if (EW_HAVE_TASK_BTF)
		return task->cgroups->dfl_cgrp->kn->id;
	return bpf_get_current_cgroup_id();
}

/* The caller's mount namespace and root directory inode: what keeps two roots apart.
 * Plain loads with the BTF-typed task (bpf_get_current_task_btf), else one probe read per
 * pointer. */
static __always_inline void caller_root(struct task_struct *task, __u64 *mntns, __u64 *root_ino)
{
	if (EW_HAVE_TASK_BTF) {
		*mntns = task->nsproxy->mnt_ns->ns.inum;
		*root_ino = task->fs->root.dentry->d_inode->i_ino;
		return;
	}
	*mntns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
	*root_ino = BPF_CORE_READ(task, fs, root.dentry, d_inode, i_ino);
}

/* kernfs_node::parent is __parent from kernfs_node___parent (the table above): one
 * flavour for each, picked by CO-RE. */
struct kernfs_node___new { struct kernfs_node *__parent; } __attribute__((preserve_access_index));
struct kernfs_node___old { struct kernfs_node *parent; } __attribute__((preserve_access_index));

static __always_inline struct kernfs_node *kernfs_parent(struct kernfs_node *kn)
{
	if (bpf_core_field_exists(((struct kernfs_node___new *)0)->__parent))
		return BPF_CORE_READ((struct kernfs_node___new *)kn, __parent);
	return BPF_CORE_READ((struct kernfs_node___old *)kn, parent);
}

/* The emulation program (tp_btf/sched_process_exec, its struct linux_binprm argument) needs
 * BTF-enabled raw tracepoints (tp_btf in the table above) and bprm->file being the last
 * interpreter when the tracepoint fires, which binfmt_misc's loop without recursion
 * (linux_binprm_interpreter) gives. The loader checks the running kernel's BTF for both
 * (probe.loader.emulation_support) and, without them, leaves the program unloaded: the
 * rest of the probe runs as before.
 * Its native-exec fast path is the same on every kernel: exec points bprm->interp at
 * bprm->filename, and only bprm_change_interp() (bprm_change_interp), called by
 * binfmt_script and binfmt_misc alone, replaces it with a copy, so the two pointers differ
 * exactly when one of them took the exec (read in 7.1's fs/exec.c, binfmt_script.c and
 * binfmt_misc.c; tests/kernels sees emulated execs reported on each kernel of the
 * matrix). */

/* binfmt_misc tables: one for the whole system before 6.7; from 6.7, commit 21ca59b365c0
 * ("binfmt_misc: enable sandboxed mounts"), each user namespace may mount its own and
 * register interpreters there, which the node's table never shows. The same program
 * (binfmt_mounts: mount and fsopen exits) runs on every kernel: before 6.7 a mount in a
 * user namespace shares the node's table, which probe.nsbinfmt then finds already read. */

#endif
