/* SPDX-License-Identifier: Apache-2.0 */
/* Layout shared by the BPF program and user space (src/execwatch/probe/layout.py).
 * Change both together: the probe compares them in the object's BTF at every load, and
 * tests/probe/test_layout.py compiles this header and compares. */
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
#define EW_ROOT_IN_FS 0x8   /* root_path is whole, inside the root's own filesystem: the */
			    /* root is its mount namespace's (a container's, after pivot_root) */

enum ew_syscall {
	EW_EXECVE = 0,
	EW_EXECVEAT = 1,
};

/* A PATH search's misses are folded: see "Folding" below. */
#define EW_FOLD_NAME_LEN 128 /* names this long or longer are never folded */
#define EW_FOLD_WORDS (EW_FOLD_NAME_LEN / 8)
#define EW_FOLD_KEY_WORDS (EW_FOLD_WORDS + 3) /* the name's words, then cgroup, root, (mntns, length) */

/* Load-time knobs: the program's only .rodata variable. */
struct ew_config {
	__u64 wakeup_interval_ns; /* wake user space at most this often per CPU */
	__u32 all_errnos;         /* 1: report every failure, not just the exec-relevant errnos */
	__u32 pad;
	__u64 death_window_ns;    /* an exit this soon after the task started is an early death */
	__u64 fold_window_ns;     /* 0: folding off; else how often user space starts a new */
				  /* fold epoch (see ew_fold_slot) */
	__u64 budget_interval_ns; /* 0: no per-cgroup budget; else 1 s / records per second */
	__u64 budget_burst_ns;    /* (burst - 1) * budget_interval_ns: see ew_budget */
	__u64 fold_key[EW_FOLD_KEY_WORDS]; /* random at every load: the tag's NH key */
};

/* Every ring-buffer record starts with its kind: user space picks its decoder, repeat key
 * and diagnosis by it (probe/events.py KINDS; record.Kind mirrors this enum). */
enum ew_kind {
	EW_KIND_EXEC_FAILED = 1, /* struct ew_event */
	EW_KIND_EARLY_DEATH = 2, /* struct ew_death */
	EW_KIND_EMULATED = 3,    /* struct ew_emulated */
	EW_KIND_ENOEXEC_EXIT = 4, /* struct ew_enoexec_exit */
};

/* Who and where, first in every record. */
struct ew_head {
	enum ew_kind kind;
	__u32 pid;              /* thread id */
	__u64 ktime_ns;         /* bpf_ktime_get_boot_ns() */
	__u64 cgroup_id;        /* cgroup v2 inode of the caller */
	__u64 cgroup_parent_id; /* its parent's: a pod's cgroup outlives its containers' */
	__u64 mntns;            /* mount namespace inode of the caller */
	__u64 root_ino;         /* inode of the caller's root directory (chroot/pivot_root) */
	__u32 tgid;
	__u32 ppid;             /* parent tgid */
	__u32 uid;
	__u32 pad;
	char comm[EW_TASK_COMM_LEN];
	char parent_comm[EW_TASK_COMM_LEN];
	char cgroup_name[EW_CGROUP_NAME_LEN]; /* the cgroup directory's own name */
};

/* A failed exec. Paths come from the dentry chain, leaf first: "c/b/a/" is /a/b/c (no
 * lookup in BPF); root and base find the caller's root and the file once it is gone. */
struct ew_event {
	struct ew_head head;  /* kind EW_KIND_EXEC_FAILED */
	__u64 root_dev;       /* the root directory's s_dev (kernel encoding) */
	__u64 base_dev;       /* the base: for AT_EMPTY_PATH the file itself; else the */
	__u64 base_ino;       /* directory a relative name resolves against (dirfd or cwd) */
	__s32 err;            /* positive errno */
	__s32 dirfd;          /* execveat only */
	__u32 flags;          /* execveat only (AT_EMPTY_PATH: fexecve) */
	__u32 syscall;        /* enum ew_syscall */
	__u32 root_mnt_id;
	__u32 base_mnt_id;
	__u32 path_flags;     /* EW_ROOT_PATH_OK | EW_BASE_SET | EW_BASE_IN_ROOT */
	__u32 pad;
	char filename[EW_PATH_LEN];
	char fd_name[EW_TASK_COMM_LEN * 4]; /* basename behind dirfd when AT_EMPTY_PATH */
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
	EW_STAT_DEATH_DROPS = 2,    /* deaths ring buffer full: early death lost, totals exact */
	EW_STAT_CGROUP_BUDGET = 3,  /* over its cgroup's budget: not sent, counts still exact */
	EW_STAT_MAX = 4,
};

/* ---- Fairness: each cgroup's share of the events ring buffer ----
 * A record about to be sent (no fold absorbed it) spends its cgroup's budget, a token
 * bucket in its GCRA form: one record per budget_interval_ns, and a burst of
 * budget_burst_ns / budget_interval_ns + 1 records back to back. Over it the record is
 * not sent, only counted in `shed` and in EW_STAT_CGROUP_BUDGET (the failure itself is
 * counted as always), so a cgroup storming unique failing names cannot fill the ring and
 * crowd out another cgroup's one failure. One bucket per cgroup, shared by every CPU, in
 * an LRU hash (budgets). Its arrival time is a plain load and store (compat.bpf.h):
 * CPUs racing on one cgroup can let a few more through, never fewer. */
struct ew_budget {
	__u64 tat;            /* the theoretical arrival time: when the bucket is full again */
	__u64 shed;           /* records over budget, since the entry was created (atomic add) */
};

/* ---- Folding: a PATH search's misses, counted in the kernel instead of sent ----
 * Each CPU has EW_FOLD_SETS sets of EW_FOLD_WAYS slots, one cache line a set, picked by a
 * 64-bit tag of (cgroup, mount namespace, root, name). A miss whose tag sits in its set
 * with the current fold epoch is only counted there; any other is sent, and then takes a
 * slot of the set: its own, or one whose last name has been read by user space since it
 * stopped folding (epoch < harvested). The tag is NH (2^-32 almost universal) keyed by
 * ew_config.fold_key, random at each load: without the key a tenant cannot make a name
 * share another's tag. The fold path reads one 64-byte set, so each miss touches one
 * cache line of fold state; the name behind a slot, for user space, is written in
 * fold_names on the send path only. Both maps are mmapped by user space, which starts a
 * new epoch every fold_window_ns (a global the program reads: no clock on this path).
 * Longer names are never folded. */
#define EW_FOLD_SET_BITS 4
#define EW_FOLD_SETS (1 << EW_FOLD_SET_BITS) /* per CPU */
#define EW_FOLD_WAYS 4
#define EW_FOLD_SLOTS (EW_FOLD_SETS * EW_FOLD_WAYS) /* per CPU */

struct ew_fold_slot {
	__u64 tag;            /* 0: never used */
	__u32 epoch;          /* the fold epoch in which this CPU last sent a record for it */
	__u32 folded;         /* repeats counted here, of every tag the slot held: never reset */
};

struct ew_fold_set {          /* fold_slots[cpu * EW_FOLD_SETS + fold_set(tag)] */
	struct ew_fold_slot way[EW_FOLD_WAYS];
};

/* fold_names[(cpu * EW_FOLD_SETS + set) * EW_FOLD_WAYS + way]: what the slot stands for */
struct ew_fold_name {
	__u64 tag;            /* written last, before the slot's: a reader that finds */
	__u64 cgroup_id;      /* another tag in the slot skips it until the next read */
	__u64 mntns;
	__u64 root_ino;
	__s32 err;
	__u32 pad;
	char filename[EW_FOLD_NAME_LEN]; /* zero after its NUL */
};

struct ew_fold_clock {        /* the program's .data: written by user space only */
	__u64 epoch;          /* the current fold epoch */
	__u64 harvested;      /* every slot of an older epoch has been read since it froze */
};

/* ---- Early deaths: a process that dies soon after a successful exec ---- */

/* death_totals index: a fatal signal is its number, a loader exit EW_TOTAL_EXIT + code. */
#define EW_TOTAL_EXIT 64
#define EW_DEATH_TOTALS (EW_TOTAL_EXIT + 256)

enum ew_death_kind {
	EW_DEATH_LOADER_EXIT = 0, /* exit_group called from inside the ELF interpreter's mapping */
	EW_DEATH_SIGNAL = 1,      /* a fatal signal with its default action */
};

struct ew_death {
	struct ew_head head;    /* kind EW_KIND_EARLY_DEATH */
	__u64 age_ns;           /* since the task started (its exec follows the fork) */
	__u64 exe_ino;          /* mm->exe_file, to find the binary once the task is gone */
	__u64 exe_dev;          /* its superblock's dev_t, kernel encoding (major << 20 | minor) */
	__u64 ip;               /* user instruction pointer at exit_group */
	__u64 interp_base;      /* AT_BASE from the saved auxv: where the loader is mapped */
	__s32 exit_code;        /* exit_group status (loader exit) */
	__s32 signal;           /* fatal signal number (signal death) */
	__u32 cause;            /* enum ew_death_kind */
	__u32 exe_flags;        /* EW_EXE_PATH_OK: exe_path reaches the task's root */
	char exe_path[EW_DPATH_LEN]; /* leaf first, like ew_event's paths */
};

#define EW_EXE_PATH_OK 0x1

/* ---- After an ENOEXEC: did the task go on to run something? ----
 * The same death window, counted from a failed exec instead of the task's start. A task
 * whose exec the kernel refused with ENOEXEC, once its record is sent, is remembered in
 * enoexec_tasks (by tgid, LRU) with the failure's time and its exec count. If it exits
 * (exit_group, or a fatal signal) within death_window_ns of the failure, an ew_enoexec_exit
 * record says how, in the deaths ring: a runtime's init gives up at once with no exec since
 * (runc exits 1 or 255), a shell that runs the file itself exits with the script's status,
 * one that retried it with /bin/sh (or execvp() did) exits after an exec (self_exec_id
 * moved on). A task that lives on sends nothing; user space waits the window for it. */
#define EW_ENOEXEC_TASKS 4096

struct ew_enoexec_task {      /* enoexec_tasks' value */
	__u64 failed_ns;      /* the failed exec's record's head.ktime_ns */
	__u64 exec_id;        /* the task's self_exec_id then */
};

struct ew_enoexec_exit {
	struct ew_head head;  /* kind EW_KIND_ENOEXEC_EXIT; ktime_ns is the exit's */
	__u64 failed_ns;      /* the failed exec's record's head.ktime_ns */
	__s32 exit_code;      /* exit_group status, or -1 for a signal */
	__s32 signal;         /* fatal signal number, or 0 */
	__u32 execed;         /* 1: a successful exec since the failure */
	__u32 pad;
};

/* ---- Emulation: a successful exec handed to a binfmt_misc interpreter ----
 * User space fills `emulators` from the node's binfmt_misc table with the interpreter of
 * every enabled foreign ELF entry, and attaches the sched_process_exec program only while
 * there is one. An exec whose bprm->interp was changed (binfmt_script or binfmt_misc) and
 * whose final file is such an interpreter is a record, folded like a PATH search's misses:
 * one per (cgroup, mount namespace, root, name) and fold epoch, the repeats counted in
 * emulated_seen; every one counted per emulator in emulated_totals (exact). */
#define EW_ARCH_LEN 16
#define EW_EMULATORS 256 /* binfmt.emulation.MAX_ENTRIES */

struct ew_file_id {           /* emulators' key: the interpreter's inode */
	__u64 dev;            /* s_dev, kernel encoding (major << 20 | minor) */
	__u64 ino;
};

struct ew_emulator {          /* emulators' value */
	__u32 index;          /* into emulated_totals and user space's table */
	__u32 pad;
	char arch[EW_ARCH_LEN]; /* the architecture its entry's magic selects */
};

struct ew_emulated_key {      /* emulated_seen's key: a name exec'd under emulation */
	__u64 cgroup_id;
	__u64 mntns;
	__u64 root_ino;
	char filename[EW_FOLD_NAME_LEN]; /* zero after its NUL; longer names are not folded */
};

struct ew_emulated_seen {
	__u64 folded;         /* repeats counted here instead of sent: never reset (atomic add) */
	__u32 epoch;          /* the fold epoch of the last record sent for the name */
	__u32 pad;
};

struct ew_emulated {
	struct ew_head head;  /* kind EW_KIND_EMULATED */
	__u64 interp_dev;     /* the interpreter that ran, as in ew_file_id */
	__u64 interp_ino;
	__u32 emulator;       /* ew_emulator.index */
	__u32 pad;
	char arch[EW_ARCH_LEN];
	char filename[EW_PATH_LEN]; /* bprm->filename: the binary, as the caller named it */
	char interp[EW_PATH_LEN];   /* bprm->interp: the interpreter's path in its entry */
};

#endif
