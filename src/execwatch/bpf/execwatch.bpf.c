// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Failed-exec probe. Only the syscall-exit tracepoints are hooked, so a
 * successful exec costs one load and one compare; everything else happens
 * on the failure path. A PATH search's repeated misses are folded: counted in
 * the kernel, one record sent per name, CPU and window (see ew_fold_slot).
 * No vmlinux.h: the few kernel types read here are declared below and
 * relocated by CO-RE against the running kernel's BTF. */
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
#define AT_FDCWD -100
#define EW_DPATH_DEPTH 40 /* dentries and mount crossings walked per path */
#define MAX_ERRNO 256

#if defined(__TARGET_ARCH_x86)
struct pt_regs { long di, si, dx, r10, r8, ip; } __attribute__((preserve_access_index));
#elif defined(__TARGET_ARCH_arm64)
struct user_pt_regs { __u64 regs[31]; __u64 sp; __u64 pc; } __attribute__((preserve_access_index));
struct pt_regs { struct user_pt_regs user_regs; } __attribute__((preserve_access_index));
#endif

struct qstr { const unsigned char *name; } __attribute__((preserve_access_index));
struct super_block { __u32 s_dev; } __attribute__((preserve_access_index));
struct inode { unsigned long i_ino; struct super_block *i_sb; } __attribute__((preserve_access_index));
struct dentry {
	struct qstr d_name;
	struct inode *d_inode;
	struct dentry *d_parent;
} __attribute__((preserve_access_index));
struct vfsmount { struct dentry *mnt_root; } __attribute__((preserve_access_index));
struct mount { /* fs/mount.h: the vfsmount is embedded */
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
	int mnt_id;
} __attribute__((preserve_access_index));
struct path { struct vfsmount *mnt; struct dentry *dentry; } __attribute__((preserve_access_index));
struct fs_struct { struct path root, pwd; } __attribute__((preserve_access_index));
struct file { struct path f_path; struct inode *f_inode; } __attribute__((preserve_access_index));
struct mm_struct {
	unsigned long saved_auxv[2];
	struct file *exe_file;
} __attribute__((preserve_access_index));
struct fdtable { unsigned int max_fds; struct file **fd; } __attribute__((preserve_access_index));
struct files_struct { struct fdtable *fdt; } __attribute__((preserve_access_index));
struct ns_common { unsigned int inum; } __attribute__((preserve_access_index));
struct mnt_namespace { struct ns_common ns; } __attribute__((preserve_access_index));
struct nsproxy { struct mnt_namespace *mnt_ns; } __attribute__((preserve_access_index));
struct kernfs_node { /* its parent: see kernfs_parent() in compat.bpf.h */
	const char *name;
	__u64 id;
} __attribute__((preserve_access_index));
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
	struct mm_struct *mm;
	__u64 start_boottime;
	__u64 self_exec_id;
	__u64 parent_exec_id;
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

/* Per cgroup: its budget of records (see ew_budget). Resized at load time. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct ew_budget);
} budgets SEC(".maps");

/* Per CPU: a path is assembled here; twice its size, so that a name read at any offset
 * below EW_DPATH_LEN fits (the verifier checks the bound, not the string). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, char[2 * EW_DPATH_LEN]);
} path_scratch SEC(".maps");

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

/* Per (cgroup, errno); errno_totals has it already. */
static __always_inline void count(__u64 cgroup_id, int err)
{
	struct ew_count_key key = { .cgroup_id = cgroup_id, .err = err };
	__u32 idx;
	__u64 one = 1;

	__u64 *v = bpf_map_lookup_elem(&counts, &key);
	if (v) {
		*v += 1;
	} else if (bpf_map_update_elem(&counts, &key, &one, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(&counts, &key); /* another CPU added it first (EEXIST) */
		if (v) {
			*v += 1;
		} else { /* really full: counted in errno_totals only */
			idx = EW_STAT_COUNTER_FULL;
			bump(&stats, &idx);
		}
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

/* Whether the cgroup's budget allows one more record now; if not, it is counted as shed.
 * GCRA: a record is sent while its cgroup's theoretical arrival time is at most
 * budget_burst_ns ahead of now, and moves it on by budget_interval_ns. */
static __always_inline bool within_budget(__u64 cgroup_id, __u64 now)
{
	struct ew_budget *b, fresh = {};
	__u64 tat;
	__u32 idx;

	if (!cfg.budget_interval_ns)
		return true;
	b = bpf_map_lookup_elem(&budgets, &cgroup_id);
	if (!b) { /* first record of this cgroup (or its entry was evicted): a full bucket */
		fresh.tat = now + cfg.budget_interval_ns;
		bpf_map_update_elem(&budgets, &cgroup_id, &fresh, BPF_NOEXIST);
		return true;
	}
	tat = b->tat > now ? b->tat : now;
	if (tat - now > cfg.budget_burst_ns) {
		__sync_fetch_and_add(&b->shed, 1);
		idx = EW_STAT_CGROUP_BUDGET;
		bump(&stats, &idx);
		return false;
	}
	b->tat = tat + cfg.budget_interval_ns;
	return true;
}

/* Room for a record of `size` bytes in `ring`, or 0: with `budgeted`, only while the
 * cgroup's budget allows one more now (within_budget counts a shed one); a full ring is
 * counted in stats[full_stat]. */
static __always_inline void *reserve_record(void *ring, __u64 size, __u32 full_stat,
					    bool budgeted, __u64 cgroup_id, __u64 now)
{
	void *rec;

	if (budgeted && !within_budget(cgroup_id, now))
		return 0;
	rec = bpf_ringbuf_reserve(ring, size, 0);
	if (!rec)
		bump(&stats, &full_stat);
	return rec;
}

static __always_inline bool reported(int err)
{
	return cfg.all_errnos || err == ENOEXEC || err == ENOENT || err == EACCES || err == ELIBBAD;
}

static __always_inline struct file *fd_file(struct task_struct *task, int fd)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds;
	struct file *f;

	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]))
		return 0;
	return f;
}

static __always_inline void read_fd_name(struct task_struct *task, int fd, char *dst, __u32 len)
{
	struct file *f = fd_file(task, fd);

	if (f)
		bpf_probe_read_kernel_str(dst, len, BPF_CORE_READ(f, f_path.dentry, d_name.name));
}

static __always_inline struct mount *real_mount(struct vfsmount *vm)
{
	return (struct mount *)((char *)vm - bpf_core_field_offset(struct mount, mnt));
}

enum walk_end {
	WALK_CUT = 0,     /* too deep or too long, detached, or unreadable */
	WALK_AT_STOP = 1, /* reached `stop` */
	WALK_AT_NS_ROOT = 2, /* reached the root of the mount namespace first */
	WALK_AT_FS_ROOT = 3, /* no vfsmount given: reached the root of the dentry's filesystem */
};

/* The names from d up to `stop` (a dentry on stop_mnt) or to the root of its mount
 * namespace, whichever comes first, crossing mounts as d_path() does; leaf first, each
 * name followed by '/', into path_scratch. With no vfsmount, the names up to the root of
 * d's own filesystem, crossing no mount. The one dentry walk: every path in a record
 * comes from here. Returns an enum walk_end.
 * Global, so the verifier checks its loop once, not once per caller's state. */
__noinline int walk_path(__u64 dentry, __u64 vfsmount, __u64 stop, __u64 stop_mnt)
{
	struct dentry *d = (struct dentry *)dentry, *up;
	struct vfsmount *vm = (struct vfsmount *)vfsmount;
	struct mount *mnt = real_mount(vm), *parent;
	__u32 zero = 0, off = 0;
	int end = WALK_CUT;
	long n;
	char *buf = bpf_map_lookup_elem(&path_scratch, &zero);

	if (!buf)
		return 0;
	for (int i = 0; i < EW_DPATH_DEPTH; i++) {
		if ((__u64)d == stop && (__u64)vm == stop_mnt) {
			end = WALK_AT_STOP;
			break;
		}
		if (vm && d == BPF_CORE_READ(vm, mnt_root)) {
			parent = BPF_CORE_READ(mnt, mnt_parent);
			if (parent == mnt) { /* the namespace's root mount */
				end = WALK_AT_NS_ROOT;
				break;
			}
			d = BPF_CORE_READ(mnt, mnt_mountpoint);
			mnt = parent;
			vm = (struct vfsmount *)((char *)parent + bpf_core_field_offset(struct mount, mnt));
			continue;
		}
		up = BPF_CORE_READ(d, d_parent);
		if (up == d && !vm) {
			end = WALK_AT_FS_ROOT;
			break;
		}
		if (up == d || off >= EW_DPATH_LEN)
			break; /* detached from any mount, or too long */
		n = bpf_probe_read_kernel_str(buf + (off & (EW_DPATH_LEN - 1)), EW_DPATH_LEN,
					      BPF_CORE_READ(d, d_name.name));
		if (n <= 0)
			break;
		off += n;
		/* A wide, imprecise bound for every path length: the verifier can then prune
		 * the loop's states instead of following each length separately. */
		asm volatile("" : "+r"(off));
		off &= 2 * EW_DPATH_LEN - 1;
		buf[(off - 1) & (2 * EW_DPATH_LEN - 1)] = '/';
		d = up;
	}
	if (off >= EW_DPATH_LEN) {
		end = WALK_CUT;
		off = EW_DPATH_LEN - 1;
	}
	asm volatile("" : "+r"(off)); /* keep the mask: the verifier must see the bound */
	buf[off & (EW_DPATH_LEN - 1)] = 0;
	return end;
}

/* walk_path, then its result into dst (EW_DPATH_LEN bytes of a record). */
static __always_inline int read_path(struct dentry *d, struct vfsmount *vm, struct dentry *stop,
				     struct vfsmount *stop_mnt, char *dst)
{
	__u32 zero = 0;
	int end = walk_path((__u64)d, (__u64)vm, (__u64)stop, (__u64)stop_mnt);
	char *buf = bpf_map_lookup_elem(&path_scratch, &zero);

	if (!buf || bpf_probe_read_kernel(dst, EW_DPATH_LEN, buf)) {
		dst[0] = 0;
		return WALK_CUT;
	}
	return end;
}

/* What finds the root and the file after the caller is gone: its root's path, and the
 * directory (dirfd or cwd) a relative name resolves against, or for AT_EMPTY_PATH the
 * file behind the fd itself, with its path inside the root. A call, off the fold path:
 * its signature puts struct ew_event in the object's BTF, which the loader checks. */
static __noinline void read_paths(struct task_struct *task, struct ew_event *e)
{
	struct dentry *root = BPF_CORE_READ(task, fs, root.dentry), *base = 0;
	struct vfsmount *root_mnt = BPF_CORE_READ(task, fs, root.mnt), *base_mnt = 0;
	struct file *f;

	e->root_dev = BPF_CORE_READ(root, d_inode, i_sb, s_dev);
	e->root_mnt_id = BPF_CORE_READ(real_mount(root_mnt), mnt_id);
	e->path_flags = read_path(root, root_mnt, 0, 0, e->root_path) == WALK_AT_NS_ROOT ?
				EW_ROOT_PATH_OK : 0;
	/* The root of its mount namespace, as a container's is after pivot_root: once the
	 * container is gone that says nothing, where the root lies in its filesystem does. */
	if (e->path_flags && !e->root_path[0])
		e->path_flags = read_path(root, 0, 0, 0, e->root_path) == WALK_AT_FS_ROOT ?
					EW_ROOT_IN_FS : 0;
	e->pad = 0;
	if (e->filename[0] != '/' && e->syscall == EW_EXECVEAT && e->dirfd != AT_FDCWD) {
		f = fd_file(task, e->dirfd);
		if (f) {
			base = BPF_CORE_READ(f, f_path.dentry);
			base_mnt = BPF_CORE_READ(f, f_path.mnt);
		}
	} else if (e->filename[0] != '/') {
		base = BPF_CORE_READ(task, fs, pwd.dentry);
		base_mnt = BPF_CORE_READ(task, fs, pwd.mnt);
	}
	if (!base || !base_mnt) {
		e->base_dev = e->base_ino = 0;
		e->base_mnt_id = 0;
		e->base_path[0] = 0;
		return;
	}
	e->base_dev = BPF_CORE_READ(base, d_inode, i_sb, s_dev);
	e->base_ino = BPF_CORE_READ(base, d_inode, i_ino);
	e->base_mnt_id = BPF_CORE_READ(real_mount(base_mnt), mnt_id);
	e->path_flags |= EW_BASE_SET;
	if (read_path(base, base_mnt, root, root_mnt, e->base_path) == WALK_AT_STOP)
		e->path_flags |= EW_BASE_IN_ROOT;
}

/* The head's task fields. The cgroup's name and parent id let user space rebuild its path
 * even when the cgroup was created and removed before anyone listed it (a container that
 * dies at once). A call: on_failure's fold path then keeps its registers to itself. */
static __noinline void fill_task(struct ew_head *h, struct task_struct *task)
{
	struct kernfs_node *kn = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn);
	struct kernfs_node *parent = kernfs_parent(kn);
	__u64 id = bpf_get_current_pid_tgid();

	h->pid = (__u32)id;
	h->cgroup_parent_id = parent ? BPF_CORE_READ(parent, id) : 0;
	h->tgid = id >> 32;
	h->ppid = BPF_CORE_READ(task, real_parent, tgid);
	h->uid = (__u32)bpf_get_current_uid_gid();
	h->pad = 0;
	bpf_get_current_comm(h->comm, sizeof(h->comm));
	BPF_CORE_READ_STR_INTO(&h->parent_comm, task, real_parent, comm);
	if (bpf_probe_read_kernel_str(h->cgroup_name, EW_CGROUP_NAME_LEN, BPF_CORE_READ(kn, name)) < 0)
		h->cgroup_name[0] = 0;
}

/* Who and where, for every kind of record: what the caller has at hand, then the task's. */
static __always_inline void fill_head(struct ew_head *h, enum ew_kind kind, struct task_struct *task,
				      __u64 now, __u64 cgroup_id, __u64 mntns, __u64 root_ino)
{
	h->kind = kind;
	h->ktime_ns = now;
	h->cgroup_id = cgroup_id;
	h->mntns = mntns;
	h->root_ino = root_ino;
	fill_task(h, task);
}

/* Resized at load time: EW_FOLD_SETS sets and EW_FOLD_SLOTS names per possible CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EW_FOLD_SETS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ew_fold_set);
} fold_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EW_FOLD_SLOTS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ew_fold_name);
} fold_names SEC(".maps");

/* Advanced by user space every fold window (Probe.take_folds updates .data): a repeat is
 * folded only in the epoch of the record its CPU sent, a load here, not a clock read. */
volatile struct ew_fold_clock fold_clock = { .epoch = 1, .harvested = 1 };

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fold_tag() masks a name's last word little-endian"
#endif

/* A miss's name, on the stack: its words up to its NUL, zero after it within its word.
 * Loops are unrolled: a variable stack offset is refused without variable_offset_stack
 * (compat.bpf.h). */
struct fold_name {
	__u64 words[EW_FOLD_WORDS];
	__u32 nwords;
	__u32 len;
};

/* One NH term: (lo + key's low half) * (hi + key's high half), each sum mod 2^32. */
static __always_inline __u64 nh(__u64 word, __u64 key)
{
	return (__u64)(__u32)((__u32)word + (__u32)key) *
	       (__u32)((__u32)(word >> 32) + (__u32)(key >> 32));
}

/* The tag of an execve ENOENT with a whole absolute name (a PATH search's miss, or a
 * missing loader: either way its first record in each epoch is sent); 0: never folded.
 * Bytes after the NUL are zeroed in its word, or they would split one name. */
static __always_inline __u64 fold_tag(__u64 cgroup_id, __u64 mntns, __u64 root_ino,
				      const char *name, struct fold_name *f)
{
	long n = bpf_probe_read_user_str(f->words, EW_FOLD_NAME_LEN, name);
	__u64 h = 0;
	__u32 last;

	if (n <= 1 || n >= EW_FOLD_NAME_LEN || (f->words[0] & 0xff) != '/')
		return 0;
	f->len = (__u32)n - 1; /* where the NUL is */
	last = f->len / 8;
	f->nwords = last + 1;
#pragma unroll
	for (__u32 i = 0; i < EW_FOLD_WORDS; i++) {
		if (i == last)
			f->words[i] &= (1ULL << (8 * (f->len % 8))) - 1;
		h += nh(f->words[i], cfg.fold_key[i]);
		if (i == last)
			break;
	}
	h += nh(cgroup_id, cfg.fold_key[EW_FOLD_WORDS]);
	h += nh(root_ino, cfg.fold_key[EW_FOLD_WORDS + 1]);
	h += nh(mntns | (__u64)f->len << 32, cfg.fold_key[EW_FOLD_WORDS + 2]);
	return h | 1;
}

/* This CPU's set for the tag. The names of one PATH search differ in a byte or two
 * (d0/ -> d1/), and NH turns that into tags in arithmetic progression: a multiply alone
 * keeps them one (1 load in 64 put five such names in one set of four ways, and one of
 * them was never folded). MurmurHash3's 64-bit finaliser mixes every bit into the top. */
static __always_inline __u32 fold_set(__u64 tag)
{
	__u64 x = tag;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return bpf_get_smp_processor_id() * EW_FOLD_SETS + (__u32)(x >> (64 - EW_FOLD_SET_BITS));
}

/* The way that holds the tag, or -1. */
static __always_inline int fold_way(const struct ew_fold_set *set, __u64 tag)
{
#pragma unroll
	for (int w = 0; w < EW_FOLD_WAYS; w++)
		if (set->way[w].tag == tag)
			return w;
	return -1;
}

/* A way whose last name's folds have all been read (see ew_fold_clock), or -1. */
static __always_inline int fold_free_way(const struct ew_fold_set *set)
{
	__u32 harvested = (__u32)fold_clock.harvested;

#pragma unroll
	for (int w = 0; w < EW_FOLD_WAYS; w++)
		if (set->way[w].epoch < harvested)
			return w;
	return -1;
}

/* A record for the tag is on its way: this CPU folds it until the epoch ends, in its own
 * slot of the set (`way`, as the fold path found it) or in a free one. With neither, this
 * name is sent every time until user space has read a slot's last folds. */
static __always_inline void fold_arm(struct ew_fold_set *set, __u32 set_idx, int way, __u64 tag,
				     __u32 epoch, const struct fold_name *f, const struct ew_head *h)
{
	struct ew_fold_name *named;
	__u32 idx;

	if (way < 0) {
		way = fold_free_way(set);
		if (way < 0)
			return;
		idx = set_idx * EW_FOLD_WAYS + (__u32)way;
		named = bpf_map_lookup_elem(&fold_names, &idx);
		if (!named)
			return;
		named->cgroup_id = h->cgroup_id;
		named->mntns = h->mntns;
		named->root_ino = h->root_ino;
		named->err = ENOENT;
		named->pad = 0;
#pragma unroll
		for (__u32 i = 0; i < EW_FOLD_WORDS; i++)
			((__u64 *)named->filename)[i] = i < f->nwords ? f->words[i] : 0;
		named->tag = tag; /* last: a reader takes the name once its tag is the slot's */
		set->way[way & (EW_FOLD_WAYS - 1)].tag = tag;
	}
	set->way[way & (EW_FOLD_WAYS - 1)].epoch = epoch;
}

/* ---- After an ENOEXEC: see ew_enoexec_exit in execwatch.h ---- */

/* Tasks whose ENOEXEC record went out, by tgid; an exit removes its task's entry, the LRU
 * the entries of tasks that never exit through a hook (SIGKILL). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, EW_ENOEXEC_TASKS);
	__type(key, __u32);
	__type(value, struct ew_enoexec_task);
} enoexec_tasks SEC(".maps");

/* When the last remembered failure's window ends: until then an exit looks its task up;
 * after it, every exit costs one array load and a compare. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} enoexec_armed SEC(".maps");

/* A call, off the fold path: it runs only after an ENOEXEC's record was sent. */
static __noinline void remember_enoexec(struct task_struct *task, __u64 now)
{
	struct ew_enoexec_task t = { .failed_ns = now };
	__u32 tgid = bpf_get_current_pid_tgid() >> 32, zero = 0;
	__u64 *until = bpf_map_lookup_elem(&enoexec_armed, &zero);

	t.exec_id = BPF_CORE_READ(task, self_exec_id);
	bpf_map_update_elem(&enoexec_tasks, &tgid, &t, BPF_ANY);
	if (until && *until < now + cfg.death_window_ns)
		*until = now + cfg.death_window_ns; /* racing CPUs: a later store can only be close */
}

/* Not inlined: the success path then runs in a program with no stack frame to set up. */
static __noinline int on_failure(long ret, enum ew_syscall sc)
{
	struct ew_fold_set *set = 0;
	struct fold_name fname;
	struct task_struct *task;
	struct pt_regs *regs;
	struct ew_event *e;
	__u64 cgroup_id, now, mntns, root_ino, tag = 0;
	__u32 idx, set_idx = 0, epoch = 0;
	int way = -1;
	const char *name;

	idx = (__u32)-ret;
	bump(&errno_totals, &idx);
	task = current_task();
	cgroup_id = current_cgroup_id(task);
	if (!reported((int)-ret)) {
		count(cgroup_id, (int)-ret);
		return 0;
	}

	regs = syscall_regs(task);
	name = (const char *)(sc == EW_EXECVEAT ? syscall_arg(regs, PARM2) : syscall_arg(regs, PARM1));
	caller_root(task, &mntns, &root_ino);
	if (sc == EW_EXECVE && ret == -ENOENT && cfg.fold_window_ns)
		tag = fold_tag(cgroup_id, mntns, root_ino, name, &fname);
	if (tag) {
		epoch = (__u32)fold_clock.epoch;
		set_idx = fold_set(tag);
		set = bpf_map_lookup_elem(&fold_slots, &set_idx);
	}
	if (set) {
		way = fold_way(set, tag);
		if (way >= 0 && set->way[way & (EW_FOLD_WAYS - 1)].epoch == epoch) {
			set->way[way & (EW_FOLD_WAYS - 1)].folded += 1; /* counted there only */
			return 0;
		}
	}
	now = bpf_ktime_get_boot_ns();
	count(cgroup_id, (int)-ret);
	e = reserve_record(&events, sizeof(*e), EW_STAT_RINGBUF_DROPS, true, cgroup_id, now);
	if (!e)
		return 0;
	fill_head(&e->head, EW_KIND_EXEC_FAILED, task, now, cgroup_id, mntns, root_ino);
	if (set) /* only once a record is sure to go: it carries the name */
		fold_arm(set, set_idx, way, tag, epoch, &fname, &e->head);
	e->err = (int)-ret;
	e->syscall = sc;
	e->fd_name[0] = 0;
	if (sc == EW_EXECVEAT) {
		e->dirfd = (int)syscall_arg(regs, PARM1);
		e->flags = (__u32)syscall_arg(regs, PARM5);
	} else {
		e->dirfd = AT_FDCWD;
		e->flags = 0;
	}
	if (bpf_probe_read_user_str(e->filename, sizeof(e->filename), name) < 0)
		e->filename[0] = 0;
	if (sc == EW_EXECVEAT && (e->flags & AT_EMPTY_PATH) && !e->filename[0])
		read_fd_name(task, e->dirfd, e->fd_name, sizeof(e->fd_name));
	read_paths(task, e);
	bpf_ringbuf_submit(e, wakeup_flag(now, cgroup_id));
	if (ret == -ENOEXEC)
		remember_enoexec(task, now);
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

/* ---- Early deaths ----
 * A process that dies right after a successful exec: the dynamic loader gave up (missing
 * library, symbol or version, wrong libc) or the program crashed before doing anything.
 * Neither hook is on the exec path: exit_group's entry, where the exit code and the caller's
 * address (inside the ELF interpreter's mapping?) discard every ordinary exit, and signal
 * delivery, where only a fatal signal with its default action gets further. */

#define AT_NULL 0
#define AT_BASE 7
#define AUXV_PAIRS 20 /* create_elf_tables() puts AT_BASE about ninth */
/* ld.so is ~200 KiB, musl's libc.so (its own loader) ~1 MiB; the loader is mapped first, at
 * the top of the mmap area, so nothing but the stack gap lies above it. */
#define LOADER_SPAN (8ULL << 20)
#define SIGILL 4
#define SIGABRT 6
#define SIGBUS 7
#define SIGFPE 8
#define SIGSEGV 11
#define FATAL_SIGNALS ((1u << SIGILL) | (1u << SIGABRT) | (1u << SIGBUS) | (1u << SIGFPE) | (1u << SIGSEGV))

struct sys_enter_exit_group_ctx {
	__u64 common;
	int syscall_nr;
	long error_code;
};

/* See events/signal/signal_deliver/format. */
struct signal_deliver_ctx {
	__u64 common;
	int sig;
	int err;
	int code;
	unsigned long sa_handler;
	unsigned long sa_flags;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized at load time */
} deaths SEC(".maps");

/* Early deaths per signal number and per EW_TOTAL_EXIT + exit code: exact, never full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EW_DEATH_TOTALS);
	__type(key, __u32);
	__type(value, __u64);
} death_totals SEC(".maps");

/* An exec since the fork (each exec bumps self_exec_id; the fork copied it) and young. */
static __always_inline __u64 early_age(struct task_struct *task, __u64 now)
{
	__u64 age;

	if (BPF_CORE_READ(task, self_exec_id) == BPF_CORE_READ(task, parent_exec_id))
		return 0;
	age = now - BPF_CORE_READ(task, start_boottime);
	return age < cfg.death_window_ns ? age + 1 : 0;
}

/* The executable, and its path as the task sees it (leaf first, up to the task's root). */
static __noinline void read_exe(struct task_struct *task, struct ew_death *e)
{
	struct file *exe = BPF_CORE_READ(task, mm, exe_file);
	int end;

	e->exe_ino = 0;
	e->exe_dev = 0;
	e->exe_flags = 0;
	e->exe_path[0] = 0;
	if (!exe)
		return;
	e->exe_ino = BPF_CORE_READ(exe, f_inode, i_ino);
	e->exe_dev = BPF_CORE_READ(exe, f_inode, i_sb, s_dev);
	end = read_path(BPF_CORE_READ(exe, f_path.dentry), BPF_CORE_READ(exe, f_path.mnt),
			BPF_CORE_READ(task, fs, root.dentry), BPF_CORE_READ(task, fs, root.mnt),
			e->exe_path);
	e->exe_flags = end == WALK_CUT ? 0 : EW_EXE_PATH_OK;
}

struct death {
	__u64 now;
	__u64 age;
	__u64 ip;
	__u64 base;
	__u32 kind;
	int value; /* signal or exit code */
};

static __noinline int report_death(const struct death *d)
{
	struct task_struct *task = current_task();
	__u64 cgroup_id = current_cgroup_id(task), mntns, root_ino;
	struct ew_death *e;
	__u32 idx;

	idx = d->kind == EW_DEATH_SIGNAL ? (__u32)d->value : EW_TOTAL_EXIT + ((__u32)d->value & 0xff);
	bump(&death_totals, &idx);
	/* Not budgeted: a death is rare, and its own ring keeps a storm's records out. */
	e = reserve_record(&deaths, sizeof(*e), EW_STAT_DEATH_DROPS, false, cgroup_id, d->now);
	if (!e)
		return 0;
	caller_root(task, &mntns, &root_ino);
	fill_head(&e->head, EW_KIND_EARLY_DEATH, task, d->now, cgroup_id, mntns, root_ino);
	e->age_ns = d->age;
	e->ip = d->ip;
	e->interp_base = d->base;
	e->exit_code = d->kind == EW_DEATH_SIGNAL ? -1 : d->value;
	e->signal = d->kind == EW_DEATH_SIGNAL ? d->value : 0;
	e->cause = d->kind;
	read_exe(task, e);
	bpf_ringbuf_submit(e, wakeup_flag(d->now, cgroup_id));
	return 0;
}

/* Reached only for exit codes 1 and 127: the auxv scan is off every ordinary exit's path. */
static __noinline int on_loader_exit(int code)
{
	struct task_struct *task = current_task();
	unsigned long pair[2];
	struct mm_struct *mm = BPF_CORE_READ(task, mm);
	struct death d = { .now = bpf_ktime_get_boot_ns(), .kind = EW_DEATH_LOADER_EXIT, .value = code };
	__u64 age = early_age(task, d.now);
	__u64 base = 0, ip;
	struct pt_regs *regs;

	if (!age || !mm)
		return 0;
	/* Pair by pair: a whole auxv on the stack would exceed the verifier's 512-byte limit
	 * for the call chain. AT_BASE is about the ninth pair, so this is a few reads. */
	for (int i = 0; i < AUXV_PAIRS; i++) {
		if (bpf_probe_read_kernel(pair, sizeof(pair),
					  __builtin_preserve_access_index(&mm->saved_auxv[2 * i])))
			return 0;
		if (pair[0] == AT_BASE) {
			base = pair[1];
			break;
		}
		if (pair[0] == AT_NULL)
			break;
	}
	if (!base) /* static: no loader */
		return 0;
	regs = syscall_regs(task);
	ip = syscall_ip(regs);
	if (ip < base || ip - base >= LOADER_SPAN)
		return 0;
	d.age = age - 1;
	d.ip = ip;
	d.base = base;
	return report_death(&d);
}

/* The record's own fields. A call: its signature puts struct ew_enoexec_exit in the
 * object's BTF, which the loader checks. */
static __noinline void fill_enoexec_exit(struct ew_enoexec_exit *e, __u64 failed_ns, int code,
					 int sig, bool execed)
{
	e->failed_ns = failed_ns;
	e->exit_code = sig ? -1 : code;
	e->signal = sig;
	e->execed = execed;
	e->pad = 0;
}

/* An exit (`sig` 0: exit_group with `code`) of a task remembered by remember_enoexec: a
 * record when it comes within the window of the failure, saying whether it exec'd since. */
static __noinline int on_enoexec_exit(int code, int sig)
{
	__u32 zero = 0, tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 *until = bpf_map_lookup_elem(&enoexec_armed, &zero);
	struct ew_enoexec_task *t;
	struct task_struct *task;
	struct ew_enoexec_exit *e;
	__u64 now, failed_ns, exec_id, cgroup_id, mntns, root_ino;
	bool execed;

	if (!until || !*until)
		return 0;
	now = bpf_ktime_get_boot_ns();
	if (now >= *until)
		return 0;
	t = bpf_map_lookup_elem(&enoexec_tasks, &tgid);
	if (!t)
		return 0;
	failed_ns = t->failed_ns;
	exec_id = t->exec_id;
	bpf_map_delete_elem(&enoexec_tasks, &tgid);
	if (now - failed_ns >= cfg.death_window_ns)
		return 0; /* it went on for the whole window */
	task = current_task();
	execed = exec_id != BPF_CORE_READ(task, self_exec_id);
	cgroup_id = current_cgroup_id(task);
	e = reserve_record(&deaths, sizeof(*e), EW_STAT_DEATH_DROPS, false, cgroup_id, now);
	if (!e)
		return 0;
	caller_root(task, &mntns, &root_ino);
	fill_head(&e->head, EW_KIND_ENOEXEC_EXIT, task, now, cgroup_id, mntns, root_ino);
	fill_enoexec_exit(e, failed_ns, code, sig, execed);
	bpf_ringbuf_submit(e, wakeup_flag(now, cgroup_id));
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_exit_group")
int enter_exit_group(struct sys_enter_exit_group_ctx *ctx)
{
	__u32 code = (__u32)ctx->error_code & 0xff;

	on_enoexec_exit((int)code, 0);
	/* glibc's loader exits 127 (missing library or symbol) or 1 (missing version); musl's 127. */
	return code == 127 || code == 1 ? on_loader_exit(code) : 0;
}

static __noinline int on_fatal_signal(int sig)
{
	struct task_struct *task = current_task();
	struct death d = { .now = bpf_ktime_get_boot_ns(), .kind = EW_DEATH_SIGNAL, .value = sig };
	__u64 age = early_age(task, d.now);

	if (!age)
		return 0;
	d.age = age - 1;
	return report_death(&d);
}

SEC("tracepoint/signal/signal_deliver")
int signal_deliver(struct signal_deliver_ctx *ctx)
{
	int sig = ctx->sig;

	if (ctx->sa_handler != 0 || sig <= 0 || sig >= 32 || !((1u << sig) & FATAL_SIGNALS))
		return 0; /* handled, ignored or not fatal: SIG_DFL is 0 */
	on_enoexec_exit(-1, sig);
	return on_fatal_signal(sig);
}

/* ---- Emulation: see ew_emulated in execwatch.h ----
 * Attached only while a binfmt_misc table (the node's, or one a user namespace mounted:
 * binfmt_mounts below) has a foreign ELF entry. A native exec costs a pointer compare:
 * bprm->interp is bprm->filename until binfmt_script or binfmt_misc replaces it
 * (compat.bpf.h: on every kernel). */

struct linux_binprm {
	struct file *file; /* when the tracepoint fires: the last interpreter that was loaded */
	const char *filename;
	const char *interp;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EW_EMULATORS);
	__type(key, struct ew_file_id);
	__type(value, struct ew_emulator);
} emulators SEC(".maps");

/* Per emulator (ew_emulator.index): emulated execs, exact. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EW_EMULATORS);
	__type(key, __u32);
	__type(value, __u64);
} emulated_totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ew_emulated_key);
	__type(value, struct ew_emulated_seen);
} emulated_seen SEC(".maps");

/* Whether this name's record went out in the current fold epoch (then its repeat is
 * counted in emulated_seen); if not, the entry takes the epoch: a record is on its way.
 * CPUs racing on one name can both send one, never lose a count. */
static __always_inline bool emulated_fold(struct ew_emulated_key *key)
{
	struct ew_emulated_seen *seen, fresh = {};
	__u32 epoch = (__u32)fold_clock.epoch;

	if (!cfg.fold_window_ns)
		return false;
	seen = bpf_map_lookup_elem(&emulated_seen, key);
	if (seen && seen->epoch == epoch) {
		__sync_fetch_and_add(&seen->folded, 1);
		return true;
	}
	if (seen) {
		seen->epoch = epoch;
		return false;
	}
	fresh.epoch = epoch; /* when the map is full, the name is sent every time */
	bpf_map_update_elem(&emulated_seen, key, &fresh, BPF_NOEXIST);
	return false;
}

/* The record's own fields. A call: its signature puts struct ew_emulated in the object's
 * BTF, which the loader checks. */
static __noinline void fill_emulated(struct ew_emulated *e, struct linux_binprm *bprm,
				     struct ew_emulator *emu, struct ew_file_id *id)
{
	e->interp_dev = id->dev;
	e->interp_ino = id->ino;
	e->emulator = emu->index;
	e->pad = 0;
	__builtin_memcpy(e->arch, emu->arch, EW_ARCH_LEN);
	if (bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), BPF_CORE_READ(bprm, filename)) < 0)
		e->filename[0] = 0;
	if (bpf_probe_read_kernel_str(e->interp, sizeof(e->interp), BPF_CORE_READ(bprm, interp)) < 0)
		e->interp[0] = 0;
}

static __noinline int on_emulated(struct linux_binprm *bprm, struct ew_emulator *emu,
				  struct ew_file_id *id)
{
	struct task_struct *task = current_task();
	struct ew_emulated_key key = {};
	struct ew_emulated *e;
	__u64 now;
	__u32 idx = emu->index;
	long n;

	bump(&emulated_totals, &idx);
	key.cgroup_id = current_cgroup_id(task);
	caller_root(task, &key.mntns, &key.root_ino);
	n = bpf_probe_read_kernel_str(key.filename, sizeof(key.filename), BPF_CORE_READ(bprm, filename));
	if (n > 0 && n < EW_FOLD_NAME_LEN && emulated_fold(&key))
		return 0;
	now = bpf_ktime_get_boot_ns();
	e = reserve_record(&events, sizeof(*e), EW_STAT_RINGBUF_DROPS, true, key.cgroup_id, now);
	if (!e)
		return 0;
	fill_head(&e->head, EW_KIND_EMULATED, task, now, key.cgroup_id, key.mntns, key.root_ino);
	fill_emulated(e, bprm, emu, id);
	bpf_ringbuf_submit(e, wakeup_flag(now, key.cgroup_id));
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(emulated_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	struct ew_file_id id;
	struct ew_emulator *emu;
	struct inode *inode;

	if (bprm->interp == bprm->filename)
		return 0; /* no binfmt_script or binfmt_misc: the native exec's whole cost */
	inode = bprm->file->f_inode;
	id.ino = inode->i_ino;
	id.dev = inode->i_sb->s_dev;
	emu = bpf_map_lookup_elem(&emulators, &id);
	return emu ? on_emulated(bprm, emu, &id) : 0;
}

/* ---- binfmt_misc mounts in any namespace (compat.bpf.h: 6.7, one table per user
 * namespace) ----
 * A count of binfmt_misc file systems mounted (mount(2)) or opened for mounting
 * (fsopen(2)) since load: the loader reads it and looks for the new table only when it
 * moved. Both syscalls are rare (a container start, a boot); nothing here is on the exec
 * path: until a foreign entry is registered somewhere, an exec pays nothing for it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} binfmt_mounts SEC(".maps");

static const char binfmt_fstype[] = "binfmt_misc";

/* At the exit of a successful mount(source, target, fstype, ...) or fsopen(fs_name, ...):
 * whether the file system type was "binfmt_misc", from the syscall's saved arguments. */
static __noinline int on_fs_syscall_exit(bool fsopen)
{
	struct pt_regs *regs = syscall_regs(current_task());
	const char *fstype;
	char name[sizeof(binfmt_fstype)];
	__u32 zero = 0;
	__u64 *n;
	int i;

	fstype = (const char *)(fsopen ? syscall_arg(regs, PARM1) : syscall_arg(regs, PARM3));
	if (bpf_probe_read_user_str(name, sizeof(name), fstype) != sizeof(name))
		return 0; /* shorter or longer than "binfmt_misc" (or unreadable) */
#pragma unroll /* the stack at a variable offset: 5.12+ (compat.bpf.h) */
	for (i = 0; i < sizeof(name); i++)
		if (name[i] != binfmt_fstype[i])
			return 0;
	n = bpf_map_lookup_elem(&binfmt_mounts, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mount")
int exit_mount(struct sys_exit_ctx *ctx)
{
	return ctx->ret < 0 ? 0 : on_fs_syscall_exit(false);
}

/* The new mount API's first step: fsconfig, fsmount and move_mount follow, so the table
 * may be in no mountinfo yet; the loader's periodic read looks again. */
SEC("tracepoint/syscalls/sys_exit_fsopen")
int exit_fsopen(struct sys_exit_ctx *ctx)
{
	return ctx->ret < 0 ? 0 : on_fs_syscall_exit(true);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
