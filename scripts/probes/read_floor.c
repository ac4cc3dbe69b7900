/* read_floor: the cost of reading the ksm-seed `full` shape's memory once,
 * the floor under any merger's CPU on that shape. Maps 76,800 pages (300
 * MiB) filled with 0x01 as `bench ksm-seed --shape full` does, then times
 * four single-threaded passes that compare each page with one cache-hot
 * page (glibc memcmp: a read of every byte, nothing else).
 *
 *   gcc -O2 -o /tmp/read_floor scripts/probes/read_floor.c && /tmp/read_floor
 *
 * A merger that keeps KSM's volatility rule reads every page at least twice
 * before merging it (hash on one visit, compare on the next); KSM reads it
 * three times (two checksums, then the compare in its tree). */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define P 4096UL
#define N 76800UL

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void)
{
	static unsigned char hot[P];
	unsigned char *r = mmap(NULL, N * P, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(r, 1, N * P);
	memset(hot, 1, P);
	for (int k = 0; k < 4; k++) {
		double t = now();
		unsigned long eq = 0;
		for (unsigned long i = 0; i < N; i++)
			eq += memcmp(r + i * P, hot, P) == 0;
		double d = now() - t;
		printf("one read of %lu pages: %.1f ms (%.1f GB/s), %lu equal\n",
		       N, d * 1e3, N * P / d / 1e9, eq);
	}
	return 0;
}
