/*
 * The floor of the remap merge path on the full shape: 76,800 identical
 * pages (300 MiB) merged onto 64 pool pages in 128-page windows with only
 * the system calls and the compare that any remap-based merge needs, and
 * none of the engine's bookkeeping (no span pagemap read, no hashing, no
 * planning, no commit). Per window: UFFDIO_WRITEPROTECT, a pagemap read
 * checking each page is present and write-protected, memcmp of each page
 * with its pool page, one mmap(MAP_FIXED) of the pool run over the
 * window, UFFDIO_REGISTER of the new VMA. Prints the thread's CPU and the
 * compare's share of it. docs/engine.md ("Where the full shape's CPU
 * goes") compares it with the engine's first pass
 * (`cargo bench -p pagefold-dedup --bench converge -- identical passes 1`).
 *
 *   gcc -O2 scripts/merge-floor.c -o /tmp/mf && sudo /tmp/mf [window_pages]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PS 4096UL
#define PAGES 76800UL
#define POOL 64UL

static double cpu(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* Registers a..a+len with userfaultfd u in write-protect mode. */
static void register_wp(int u, char *a, size_t len, const char *what)
{
	struct uffdio_register reg = {
		.range = { (uintptr_t)a, len },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};
	if (ioctl(u, UFFDIO_REGISTER, &reg))
		die(what);
}

int main(int argc, char **argv)
{
	size_t w = argc > 1 ? strtoul(argv[1], NULL, 0) : 128;
	if (w == 0 || w > 512 || PAGES % w)
		return fprintf(stderr, "window: 1..512 dividing %lu\n", PAGES), 1;
	char *r = mmap(NULL, PAGES * PS, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd = memfd_create("pool", 0);
	if (r == MAP_FAILED || fd < 0 || ftruncate(fd, POOL * PS))
		die("setup");
	char *pool = mmap(NULL, POOL * PS, PROT_READ | PROT_WRITE, MAP_SHARED,
			  fd, 0);
	if (pool == MAP_FAILED)
		die("pool");
	memset(r, 1, PAGES * PS);
	memset(pool, 1, POOL * PS);
	/* Push the region out of the caches, as the scan finds it. */
	char *evict = malloc(512 << 20);
	if (!evict)
		die("malloc");
	memset(evict, 2, 512 << 20);

	int u = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = { .api = UFFD_API };
	if (u < 0 || ioctl(u, UFFDIO_API, &api))
		die("userfaultfd");
	register_wp(u, r, PAGES * PS, "register");
	int pm = open("/proc/self/pagemap", O_RDONLY);
	if (pm < 0)
		die("pagemap");

	uint64_t ent[512];
	long bad = 0;
	double compare = 0, t0 = cpu();
	for (size_t p = 0; p < PAGES; p += w) {
		char *a = r + p * PS;
		size_t slot = (p / w) * w % POOL;
		size_t run = w < POOL ? w : POOL;
		struct uffdio_writeprotect wp = {
			.range = { (uintptr_t)a, w * PS },
			.mode = UFFDIO_WRITEPROTECT_MODE_WP,
		};
		if (ioctl(u, UFFDIO_WRITEPROTECT, &wp))
			die("protect");
		if (pread(pm, ent, w * 8, (uintptr_t)a / PS * 8) != (ssize_t)(w * 8))
			die("pagemap read");
		for (size_t i = 0; i < w; i++)
			bad += !(ent[i] >> 63) || !(ent[i] >> 57 & 1);
		double tc = cpu();
		for (size_t i = 0; i < w; i++)
			bad += memcmp(a + i * PS, pool + (slot + i) % POOL * PS, PS) != 0;
		compare += cpu() - tc;
		/* One mmap per run of consecutive pool pages, as the engine's. */
		for (size_t i = 0; i < w; i += run)
			if (mmap(a + i * PS, run * PS, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_FIXED, fd,
				 (slot + i) % POOL * PS) == MAP_FAILED)
				die("mmap");
		register_wp(u, a, w * PS, "re-register");
	}
	double d = cpu() - t0;
	printf("window %zu: %.1f ms CPU for %lu pages (compare %.1f ms), %ld unexpected\n",
	       w, d * 1e3, PAGES, compare * 1e3, bad);
	return bad != 0;
}
