/* The microVM's /init for `execwatch scan --run --cpu-level` (smoke/microvm.py).
 *
 * PID 1 of a QEMU guest whose initramfs is the image's root. It reads its orders from
 * /.execwatch-run (written by the host, then unlinked), mounts /proc, /dev and a capped
 * /tmp, starts the program as the image's user with the container runtime's default
 * capabilities, rlimits and no_new_privs, waits for it or its deadline, and writes ONE
 * report line on the second serial port (ttyS1), marked with the host's nonce, then
 * reboots (QEMU runs with -no-reboot, so it exits). The program never sees the nonce:
 * it is read from a file unlinked before the fork, this process is not dumpable, and the
 * program has no CAP_SYS_PTRACE. Every read is bounded.
 *
 * The orders: NUL-terminated fields, in this order: nonce, uid, gid, workdir, deadline
 * (ms), cpu (s), address space, processes, open files, file size, /tmp bytes, output
 * bytes kept, argc, argv..., envc, env...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define ORDERS "/.execwatch-run"
#define REPORT_PORT "/dev/ttyS1"
#define MAX_ORDERS (1 << 20)
#define MAX_ARGS 4096
#define MAX_KEPT (64 << 10)
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

struct orders {
	const char *nonce, *workdir;
	long uid, gid, deadline_ms, cpu_s, as, nproc, nofile, fsize, tmp_bytes, kept;
	char *argv[MAX_ARGS + 1], *envp[MAX_ARGS + 1];
};

struct stream {
	int fd;
	size_t len;
	char data[MAX_KEPT];
};

static char orders_buf[MAX_ORDERS + 1];
static struct stream out_stream, err_stream;
static char program[4096];

static void halt(void)
{
	sync();
	reboot(RB_AUTOBOOT);
	for (;;)
		pause();
}

static void say_console(const char *what)
{
	int fd = open("/dev/console", O_WRONLY | O_NOCTTY);
	if (fd >= 0) {
		dprintf(fd, "execwatch-init: %s (%s)\n", what, strerror(errno));
		close(fd);
	}
}

static long read_orders(void)
{
	int fd = open(ORDERS, O_RDONLY | O_CLOEXEC);
	long len = 0, n;
	if (fd < 0)
		return -1;
	while (len < MAX_ORDERS && (n = read(fd, orders_buf + len, MAX_ORDERS - len)) > 0)
		len += n;
	close(fd);
	unlink(ORDERS);
	orders_buf[len] = 0;
	return len;
}

static const char *field(long len, long *at)
{
	const char *start = orders_buf + *at;
	if (*at >= len)
		return NULL;
	*at += (long)strnlen(start, (size_t)(len - *at)) + 1;
	return *at <= len ? start : NULL;
}

static int number(long len, long *at, long *value)
{
	const char *text = field(len, at);
	char *end;
	if (!text)
		return -1;
	*value = strtol(text, &end, 10);
	return *end || end == text ? -1 : 0;
}

static int list(long len, long *at, char **items)
{
	long count, i;
	if (number(len, at, &count) || count < 0 || count > MAX_ARGS)
		return -1;
	for (i = 0; i < count; i++)
		if (!(items[i] = (char *)field(len, at)))
			return -1;
	items[count] = NULL;
	return 0;
}

static int parse(long len, struct orders *o)
{
	long at = 0;
	long *numbers[] = {&o->uid, &o->gid};
	long *limits[] = {&o->deadline_ms, &o->cpu_s, &o->as, &o->nproc, &o->nofile,
			  &o->fsize, &o->tmp_bytes, &o->kept};
	size_t i;
	if (!(o->nonce = field(len, &at)))
		return -1;
	for (i = 0; i < 2; i++)
		if (number(len, &at, numbers[i]))
			return -1;
	if (!(o->workdir = field(len, &at)))
		return -1;
	for (i = 0; i < sizeof(limits) / sizeof(limits[0]); i++)
		if (number(len, &at, limits[i]))
			return -1;
	if (o->kept > MAX_KEPT)
		o->kept = MAX_KEPT;
	if (list(len, &at, o->argv) || !o->argv[0] || list(len, &at, o->envp))
		return -1;
	return 0;
}

/* A mount point: an image's file or symlink there is replaced by a directory. */
static void directory(const char *path)
{
	struct stat st;
	if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return;
	unlink(path);
	mkdir(path, 0755);
}

static void mount_all(const struct orders *o)
{
	char tmp_opts[64];
	static const char *const links[][2] = {{"/proc/self/fd", "/dev/fd"},
					       {"/proc/self/fd/0", "/dev/stdin"},
					       {"/proc/self/fd/1", "/dev/stdout"},
					       {"/proc/self/fd/2", "/dev/stderr"}};
	size_t i;
	directory("/proc");
	directory("/dev");
	directory("/tmp");
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		say_console("mount /proc");
	if (mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID | MS_NOEXEC, NULL))
		say_console("mount /dev");
	snprintf(tmp_opts, sizeof(tmp_opts), "size=%ld,mode=1777", o->tmp_bytes);
	if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts))
		say_console("mount /tmp");
	mkdir("/dev/shm", 01777);
	mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m");
	for (i = 0; i < sizeof(links) / sizeof(links[0]); i++)
		symlink(links[i][0], links[i][1]);
}

/* runc's lookup: a name with a slash as given, else the first executable file on PATH. */
static void find_program(const char *name, char *const *envp)
{
	const char *path = DEFAULT_PATH, *dir, *end;
	struct stat st;
	size_t i;
	snprintf(program, sizeof(program), "%s", name);
	if (strchr(name, '/'))
		return;
	for (i = 0; envp[i]; i++)
		if (!strncmp(envp[i], "PATH=", 5))
			path = envp[i] + 5;
	for (dir = path;; dir = end + 1) {
		char candidate[4096];
		end = strchrnul(dir, ':');
		snprintf(candidate, sizeof(candidate), "%.*s/%s", (int)(end - dir),
			 end == dir ? "." : dir, name);
		if (stat(candidate, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111)) {
			snprintf(program, sizeof(program), "%s", candidate);
			return;
		}
		if (!*end)
			return;
	}
}

static void make_workdir(const char *workdir)
{
	char path[4096], *p;
	snprintf(path, sizeof(path), "%s", workdir);
	for (p = path + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			mkdir(path, 0755);
			*p = '/';
		}
	mkdir(path, 0755);
}

/* The capabilities a container runtime (containerd, Docker) gives a container. */
static int kept_capability(int cap)
{
	static const int runtime[] = {0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31};
	size_t i;
	for (i = 0; i < sizeof(runtime) / sizeof(runtime[0]); i++)
		if (runtime[i] == cap)
			return 1;
	return 0;
}

static void limit(int which, long value)
{
	struct rlimit r = {(rlim_t)value, (rlim_t)value};
	setrlimit(which, &r);
}

static void child(const struct orders *o, int out, int err, int exec_report)
{
	int null = open("/dev/null", O_RDONLY), cap, e;
	setsid();
	dup2(null, 0);
	dup2(out, 1);
	dup2(err, 2);
	if (chdir(o->workdir))
		chdir("/");
	limit(RLIMIT_CPU, o->cpu_s);
	limit(RLIMIT_AS, o->as);
	limit(RLIMIT_NPROC, o->nproc);
	limit(RLIMIT_NOFILE, o->nofile);
	limit(RLIMIT_FSIZE, o->fsize);
	for (cap = 0; cap < 64; cap++)
		if (!kept_capability(cap))
			prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
	if (setgroups(0, NULL) || setgid((gid_t)o->gid) || setuid((uid_t)o->uid) ||
	    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
		e = -errno;  /* a negative errno: the setup, not the exec, failed */
		write(exec_report, &e, sizeof(e));
		_exit(126);
	}
	execve(program, o->argv, o->envp);
	e = errno;
	write(exec_report, &e, sizeof(e));
	_exit(127);
}

/* A kernel without /dev/console in its built-in initramfs starts the init with fds 0-2
 * closed: the pipes would then take them, and dup2 onto the same fd keeps CLOEXEC. */
static void standard_fds(void)
{
	int fd;
	while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd < 3)
		;
	if (fd >= 3)
		close(fd);
}

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void keep(struct stream *s, long kept)
{
	char chunk[4096];
	ssize_t n = read(s->fd, chunk, sizeof(chunk));
	size_t room;
	if (n <= 0) {
		close(s->fd);
		s->fd = -1;
		return;
	}
	room = (size_t)kept > s->len ? (size_t)kept - s->len : 0;
	if ((size_t)n < room)
		room = (size_t)n;
	memcpy(s->data + s->len, chunk, room);
	s->len += room;
}

/* Wait for the program, keeping its output; 1 when its deadline passed. */
static int wait_for(pid_t pid, const struct orders *o, long started, int *status)
{
	long deadline = started + o->deadline_ms, ended = -1;
	for (;;) {
		struct pollfd fds[2] = {{out_stream.fd, POLLIN, 0}, {err_stream.fd, POLLIN, 0}};
		long t = now_ms(), wait = deadline - t;
		pid_t gone;
		int st, i;
		if (ended < 0) {
			while ((gone = waitpid(-1, &st, WNOHANG)) > 0)
				if (gone == pid) {
					*status = st;
					ended = t;
				}
		}
		if (ended >= 0 && ((out_stream.fd < 0 && err_stream.fd < 0) || t - ended > 200))
			return 0;
		if (ended < 0 && wait <= 0) {
			kill(-1, SIGKILL);
			while (waitpid(-1, status, 0) != pid)
				;
			return 1;
		}
		poll(fds, 2, 50);
		for (i = 0; i < 2; i++)
			if (fds[i].fd >= 0 && fds[i].revents)
				keep(i ? &err_stream : &out_stream, o->kept);
	}
}

static void hex(FILE *f, const char *data, size_t len)
{
	size_t i;
	if (!len)
		fputc('-', f);
	for (i = 0; i < len; i++)
		fprintf(f, "%02x", (unsigned char)data[i]);
}

/* What the program left running dies, as when a container's PID 1 exits: nothing writes
 * on the report port while the report is written. */
static void end_all(void)
{
	kill(-1, SIGKILL);
	while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
		;
}

static void report(const struct orders *o, int exec_errno, int status, int timed_out,
		   int ran)
{
	int fd;
	struct termios tio;
	FILE *f;
	end_all();
	fd = open(REPORT_PORT, O_WRONLY | O_NOCTTY);
	if (fd < 0) {
		say_console("open " REPORT_PORT);
		return;
	}
	if (tcgetattr(fd, &tio) == 0) {
		cfmakeraw(&tio);
		tcsetattr(fd, TCSANOW, &tio);
	}
	f = fdopen(fd, "w");
	fprintf(f, "\nEXECWATCH-REPORT-1 %s program=", o->nonce);
	hex(f, program, strlen(program));
	if (ran)
		fprintf(f, " exec_errno=- status=%d timed_out=%d", status, timed_out);
	else
		fprintf(f, " exec_errno=%d status=- timed_out=0", exec_errno);
	fputs(" stdout=", f);
	hex(f, out_stream.data, out_stream.len);
	fputs(" stderr=", f);
	hex(f, err_stream.data, err_stream.len);
	fprintf(f, " END %s\n", o->nonce);
	fflush(f);
	tcdrain(fd);
}

int main(void)
{
	static struct orders o;
	int out[2], err[2], exec_pipe[2], exec_errno = 0, status = 0, timed_out;
	long len = read_orders(), started;
	pid_t pid;
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (len < 0 || parse(len, &o)) {
		say_console("unreadable orders");
		halt();
	}
	mount_all(&o);
	standard_fds();
	make_workdir(o.workdir);
	find_program(o.argv[0], o.envp);
	if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(exec_pipe, O_CLOEXEC)) {
		say_console("pipe");
		halt();
	}
	started = now_ms();
	pid = fork();
	if (pid == 0)
		child(&o, out[1], err[1], exec_pipe[1]);
	close(out[1]);
	close(err[1]);
	close(exec_pipe[1]);
	out_stream.fd = out[0];
	err_stream.fd = err[0];
	if (read(exec_pipe[0], &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno)) {
		waitpid(pid, &status, 0);
		report(&o, exec_errno, 0, 0, 0);
		halt();
	}
	timed_out = wait_for(pid, &o, started, &status);
	report(&o, 0, status, timed_out, 1);
	halt();
	return 0;
}
