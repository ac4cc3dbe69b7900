/* ksm_stale_rmap: does memory mapped where KSM-scanned memory used to be
 * inherit KSM's smart-scan state? Phase 1 maps 8,192 unique pages, makes
 * them MADV_MERGEABLE and lets ksmd scan them 12 times (their ages grow),
 * then stops KSM, makes them unmergeable and unmaps them: the process's
 * rmap items stay (printed). Phase 2 maps 4,096 pairs of identical pages,
 * at the same address (`reuse`), the same with `smart_scan` 0 for phase 2
 * (`reuse-nosmart`), or 16 MiB lower (`fresh`), and counts this
 * process's merged pages after each of 8 full scans at 10000 pages / 0 ms.
 * Root only; takes no lock itself: run it under the tests' KSM lock. KSM's
 * knobs are saved to SAVED before they change and restored at the end; a
 * run killed before that leaves SAVED behind, and the next run restores
 * from it first.
 *
 *   gcc -O2 -o /tmp/ksm_stale_rmap scripts/probes/ksm_stale_rmap.c
 *   flock /tmp/pagefold-ksm-tests.lock /tmp/ksm_stale_rmap reuse
 *   flock /tmp/pagefold-ksm-tests.lock /tmp/ksm_stale_rmap fresh
 *   flock /tmp/pagefold-ksm-tests.lock /tmp/ksm_stale_rmap reuse-nosmart
 *
 * Measured 2026-12-01 (kernel 6.18, smart_scan 1): `fresh` merged all
 * 8,192 pages in the second full scan; `reuse` merged none in eight;
 * `reuse-nosmart` all of them in the second, like `fresh` (which is why
 * the engine's KSM assist turns smart scan off while it drives KSM). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static long ksm_r(const char *n) { char p[256]; snprintf(p, sizeof p, "/sys/kernel/mm/ksm/%s", n); FILE *f = fopen(p, "r"); long v = -1; if (f) { if (fscanf(f, "%ld", &v) != 1) v = -1; fclose(f); } return v; }
static void ksm_w(const char *n, long v) { char p[256]; snprintf(p, sizeof p, "/sys/kernel/mm/ksm/%s", n); FILE *f = fopen(p, "w"); if (!f) { perror(p); exit(1); } fprintf(f, "%ld", v); fclose(f); }
static long self_stat(const char *k) { FILE *f = fopen("/proc/self/ksm_stat", "r"); char l[256]; long v = -1; size_t n = strlen(k); while (f && fgets(l, sizeof l, f)) if (!strncmp(l, k, n) && l[n] == ' ') v = atol(l + n + 1); if (f) fclose(f); return v; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
#define SAVED "/run/ksm_stale_rmap.saved"
#define NKNOBS 4
static const char *KNOBS[NKNOBS] = { "run", "pages_to_scan", "sleep_millisecs", "smart_scan" };
static long saved[NKNOBS];
/* Restores the knobs a killed run saved, then saves the current ones. */
static void save_knobs(void) {
    FILE *f = fopen(SAVED, "r");
    if (f) {
        long v[NKNOBS];
        if (fscanf(f, "%ld %ld %ld %ld", &v[0], &v[1], &v[2], &v[3]) == NKNOBS) {
            for (int i = NKNOBS - 1; i >= 0; i--) ksm_w(KNOBS[i], v[i]);
            fprintf(stderr, "restored KSM knobs left by a killed run\n");
        }
        fclose(f);
    }
    for (int i = 0; i < NKNOBS; i++) saved[i] = ksm_r(KNOBS[i]);
    f = fopen(SAVED, "w");
    if (!f) { perror(SAVED); exit(1); }
    fprintf(f, "%ld %ld %ld %ld\n", saved[0], saved[1], saved[2], saved[3]);
    fclose(f);
}
static void wait_scans(long n) { long fs = ksm_r("full_scans"); while (ksm_r("full_scans") < fs + n) usleep(200); }
#define PAGES 8192
int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "reuse") && strcmp(argv[1], "fresh") && strcmp(argv[1], "reuse-nosmart"))) { fprintf(stderr, "usage: %s reuse|fresh|reuse-nosmart\n", argv[0]); return 2; }
    int reuse = strcmp(argv[1], "fresh") != 0;
    int nosmart = !strcmp(argv[1], "reuse-nosmart");
    size_t len = (size_t)PAGES * 4096;
    save_knobs();
    char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 1; }
    madvise(a, len, MADV_NOHUGEPAGE);
    srand(1);
    for (size_t i = 0; i < len; i += 8) *(long *)(a + i) = ((long)rand() << 31) ^ rand();
    madvise(a, len, MADV_MERGEABLE);
    ksm_w("pages_to_scan", 10000); ksm_w("sleep_millisecs", 0); ksm_w("run", 1);
    wait_scans(12);
    ksm_w("run", 0);
    madvise(a, len, MADV_UNMERGEABLE);
    munmap(a, len);
    printf("phase 1 unmapped, KSM stopped: this process's rmap items %ld\n", self_stat("ksm_rmap_items"));
    char *b = mmap(reuse ? a : a - 4 * len, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (b == MAP_FAILED) { perror("mmap phase 2"); return 1; }
    madvise(b, len, MADV_NOHUGEPAGE);
    srand(2);
    for (size_t i = 0; i < len / 2; i += 8) { long v = ((long)rand() << 31) ^ rand(); *(long *)(b + i) = v; *(long *)(b + len / 2 + i) = v; }
    madvise(b, len, MADV_MERGEABLE);
    if (nosmart) ksm_w("smart_scan", 0);
    double t0 = now();
    ksm_w("run", 1);
    for (int s = 1; s <= 8; s++) { wait_scans(1); printf("%s: full scan %d at %.3f s: merged pages %ld of %d\n", argv[1], s, now() - t0, self_stat("ksm_merging_pages"), PAGES); }
    ksm_w("run", 0);
    madvise(b, len, MADV_UNMERGEABLE);
    for (int i = NKNOBS - 1; i >= 0; i--) ksm_w(KNOBS[i], saved[i]);
    unlink(SAVED);
    return 0;
}
