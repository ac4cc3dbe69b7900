/*
 * The read floor of the full shape's final compare: memcmp of 300 MiB of
 * freshly written pages (76,800, every byte 0x01) against one hot page,
 * as the merge path compares each page of a run with its pool slot.
 * docs/engine.md ("Where the full shape's CPU goes") quotes it.
 *
 *   gcc -O2 scripts/read-floor.c -o /tmp/rf && /tmp/rf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void)
{
	const size_t n = 76800, ps = 4096;
	char *r = mmap(NULL, n * ps, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	static char ref[4096];
	if (r == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(r, 1, n * ps);
	memset(ref, 1, sizeof(ref));
	/* Push the region's tail out of the caches, as the scan finds it. */
	char *e = malloc(64 << 20);
	if (!e)
		return 1;
	memset(e, 2, 64 << 20);
	double t = now();
	long differ = 0;
	for (size_t i = 0; i < n; i++)
		differ += memcmp(r + i * ps, ref, ps) != 0;
	double d = now() - t;
	printf("memcmp of %zu pages: %.1f ms (%.2f GB/s), %ld differ\n", n,
	       d * 1e3, n * ps / d / 1e9, differ);
	return differ != 0;
}
