// Exec load generator for benchmarks/probe_bench.py.
//   execgen success N            fork+exec /bin/true N times (successful execs)
//   execgen fail PATH N          call execve(PATH) N times in this process (each fails)
//   execgen storm RATE SECS P..  failing execve at RATE/s for SECS, cycling over paths P..
//   execgen deaths RATE SECS P   fork+exec P at RATE/s for SECS; P dies in its loader
//   execgen search RATE SECS N   fork+execvp N at RATE/s for SECS: glibc tries each PATH entry
//   execgen run RATE SECS P      fork+exec P at RATE/s for SECS (the same without a search)
// Prints the number of failed execs (or of children that exited 127, or of children that
// ran and exited 0) it caused, so the benchmark can check exactness.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long try_exec(const char *path)
{
	char *argv[] = { (char *)path, NULL };
	char *envp[] = { NULL };
	execve(path, argv, envp);
	return errno != 0;
}

/* Up to 8 children in flight: one at a time caps the rate at the fork+exec latency. Each
 * runs P (search: looks P up in PATH like execvp). Returns how many exited with `counted`. */
static long children(int search, int counted_status, double rate, double secs, const char *p)
{
	double start = now(), end = start + secs;
	long done = 0, running = 0, counted = 0;
	int status;

	for (double t = start; t < end || running; t = now()) {
		long due = t < end ? (long)((t - start) * rate) : done;
		for (; done < due && running < 8; done++, running++) {
			if (fork() == 0) {
				char *a[] = { (char *)p, NULL };
				char *e[] = { NULL };
				if (search)
					execvp(a[0], a);
				else
					execve(a[0], a, e);
				_exit(126);
			}
		}
		pid_t pid;
		while ((pid = waitpid(-1, &status, running >= 8 || t >= end ? 0 : WNOHANG)) > 0) {
			running--;
			counted += WIFEXITED(status) && WEXITSTATUS(status) == counted_status;
			if (running < 8 && t < end)
				break;
		}
		if (done >= due)
			usleep(200);
	}
	return counted;
}

int main(int argc, char **argv)
{
	long failed = 0;

	if (argc == 3 && !strcmp(argv[1], "success")) {
		long n = atol(argv[2]);
		for (long i = 0; i < n; i++) {
			pid_t pid = fork();
			if (pid == 0) {
				char *a[] = { "/bin/true", NULL };
				execv(a[0], a);
				_exit(127);
			}
			waitpid(pid, NULL, 0);
		}
	} else if (argc == 4 && !strcmp(argv[1], "fail")) {
		long n = atol(argv[3]);
		for (long i = 0; i < n; i++)
			failed += try_exec(argv[2]);
	} else if (argc >= 5 && !strcmp(argv[1], "storm")) {
		double rate = atof(argv[2]), secs = atof(argv[3]);
		int npaths = argc - 4;
		double start = now(), end = start + secs;
		long done = 0;
		for (double t = start; t < end; t = now()) {
			long due = (long)((t - start) * rate);
			while (done < due)
				failed += try_exec(argv[4 + done++ % npaths]);
			usleep(200);
		}
	} else if (argc == 5 && !strcmp(argv[1], "deaths")) {
		failed = children(0, 127, atof(argv[2]), atof(argv[3]), argv[4]);
	} else if (argc == 5 && (!strcmp(argv[1], "search") || !strcmp(argv[1], "run"))) {
		failed = children(argv[1][0] == 's', 0, atof(argv[2]), atof(argv[3]), argv[4]);
	} else {
		fprintf(stderr, "usage: execgen success N | fail PATH N | storm RATE SECS PATH... | deaths|search|run RATE SECS PATH\n");
		return 2;
	}
	printf("%ld\n", failed);
	return 0;
}
