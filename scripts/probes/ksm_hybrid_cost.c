/* ksm_hybrid_cost: ksmd's CPU to merge two regions of N pages where B holds
 * A's distinct pages in a random order (the ksm-seed `scattered` shape),
 * with or without what the KSM assist adds around KSM: a userfaultfd
 * write-protect registration of both regions, and `pool` single pages of B
 * replaced by MAP_SHARED memfd mappings (the engine's merges before the
 * hand-over, one VMA each). Root only. KSM's knobs (run, pages_to_scan,
 * sleep_millisecs) are saved to SAVED before they change and restored at
 * the end; a run killed before that leaves SAVED behind, and the next run
 * restores from it first.
 *
 *   gcc -O2 -o /tmp/ksm_hybrid_cost scripts/probes/ksm_hybrid_cost.c
 *   /tmp/ksm_hybrid_cost PAGES_TO_SCAN SLEEP_MS UFFD(0|1) POOL_PAGES [N]
 *
 * e.g. `10000 0 0 0 524288` (ksm-max on 2 x 2 GiB) against
 * `16384 20 1 4095 524288` (the hybrid's pace and mappings). */
#define _GNU_SOURCE
#include <errno.h>
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
#include <dirent.h>
#define P 4096UL
static unsigned long N = 131072;
static void ksm_w(const char *k, long v) { char p[128]; snprintf(p, sizeof p, "/sys/kernel/mm/ksm/%s", k); FILE *f = fopen(p, "w"); if (f) { fprintf(f, "%ld", v); fclose(f); } }
static long ksm_r(const char *k) { char p[128]; long v = -1; snprintf(p, sizeof p, "/sys/kernel/mm/ksm/%s", k); FILE *f = fopen(p, "r"); if (f) { if (fscanf(f, "%ld", &v) != 1) v = -1; fclose(f); } return v; }
static void fill(char *pg, uint64_t id) { uint64_t x = id * 0x9E3779B97F4A7C15ULL + 1; for (size_t j = 0; j < P / 8; j++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ((uint64_t *)pg)[j] = x; } }
static int ksmd_pid(void) { DIR *d = opendir("/proc"); struct dirent *e; char p[300], c[64]; while ((e = readdir(d))) { snprintf(p, sizeof p, "/proc/%s/comm", e->d_name); FILE *f = fopen(p, "r"); if (!f) continue; if (fgets(c, sizeof c, f) && !strcmp(c, "ksmd\n")) { fclose(f); closedir(d); return atoi(e->d_name); } fclose(f); } closedir(d); return -1; }
static double cpu(int pid) { char p[64], b[1024]; snprintf(p, sizeof p, "/proc/%d/stat", pid); FILE *f = fopen(p, "r"); fgets(b, sizeof b, f); fclose(f); char *s = strrchr(b, ')') + 2; long ut, st; int i; for (i = 0; i < 11; i++) s = strchr(s, ' ') + 1; sscanf(s, "%ld %ld", &ut, &st); return (ut + st) / (double)sysconf(_SC_CLK_TCK); }
#define SAVED "/run/ksm_hybrid_cost.saved"
static const char *KNOBS[3] = { "run", "pages_to_scan", "sleep_millisecs" };
/* Restores the knobs a killed run saved, then saves the current ones. */
static void save_knobs(void) {
    FILE *f = fopen(SAVED, "r");
    if (f) {
        long v[3];
        if (fscanf(f, "%ld %ld %ld", &v[0], &v[1], &v[2]) == 3) {
            ksm_w("run", 2);
            for (int i = 2; i >= 0; i--) ksm_w(KNOBS[i], v[i]);
            fprintf(stderr, "restored KSM knobs left by a killed run\n");
        }
        fclose(f);
    }
    f = fopen(SAVED, "w");
    if (!f) { perror(SAVED); exit(1); }
    fprintf(f, "%ld %ld %ld\n", ksm_r("run"), ksm_r("pages_to_scan"), ksm_r("sleep_millisecs"));
    fclose(f);
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s PAGES_TO_SCAN SLEEP_MS UFFD POOL_PAGES [N]\n", argv[0]); return 2; }
    if (argc > 5)
        N = atol(argv[5]);
    save_knobs();
    long pts = atol(argv[1]), slp = atol(argv[2]); int uf = atoi(argv[3]); long pool = atol(argv[4]);
    long o_run = ksm_r("run"), o_pts = ksm_r("pages_to_scan"), o_slp = ksm_r("sleep_millisecs");
    ksm_w("run", 2); while (ksm_r("pages_shared") > 0) usleep(50000);
    char *A = mmap(NULL, N * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *B = mmap(NULL, N * P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(A, N * P, MADV_NOHUGEPAGE); madvise(B, N * P, MADV_NOHUGEPAGE);
    uint32_t *perm = malloc(N * 4); for (uint32_t i = 0; i < N; i++) perm[i] = i;
    uint64_t s = 88172645463325252ULL; for (uint32_t i = N - 1; i > 0; i--) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; uint32_t j = s % (i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (size_t i = 0; i < N; i++) { fill(A + i * P, i); fill(B + perm[i] * P, i); }
    if (uf) {
        int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
        struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP };
        if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("uffd"); return 1; }
        struct uffdio_register reg = { .range = { (uintptr_t)A, N * P }, .mode = UFFDIO_REGISTER_MODE_WP };
        if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("reg"); return 1; }
        reg.range.start = (uintptr_t)B; if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("reg"); return 1; }
    }
    long target = N;
    if (pool) {
        int mfd = memfd_create("pool", 0); ftruncate(mfd, pool * P);
        /* map pool slot k over B's page perm[k*step] (scattered single pages) */
        long step = N / pool;
        for (long k = 0; k < pool; k++) { size_t pg = perm[k * step]; if (mmap(B + pg * P, P, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mfd, k * P) == MAP_FAILED) { perror("mmap"); return 1; } }
        target = N - pool;
    }
    madvise(A, N * P, MADV_MERGEABLE); madvise(B, N * P, MADV_MERGEABLE);
    int kp = ksmd_pid();
    ksm_w("pages_to_scan", pts); ksm_w("sleep_millisecs", slp);
    double c0 = cpu(kp), t0 = now(); long fs0 = ksm_r("full_scans");
    ksm_w("run", 1);
    while (ksm_r("pages_sharing") < target && now() - t0 < 120) usleep(10000);
    double c1 = cpu(kp), t1 = now();
    printf("pts %ld sleep %ld uffd %d pool %ld: sharing %ld/%ld in %.2f s, ksmd cpu %.2f s, full_scans %ld\n", pts, slp, uf, pool, ksm_r("pages_sharing"), target, t1 - t0, c1 - c0, ksm_r("full_scans") - fs0);
    ksm_w("run", 2); while (ksm_r("pages_shared") > 0) usleep(50000);
    ksm_w("pages_to_scan", o_pts); ksm_w("sleep_millisecs", o_slp); ksm_w("run", o_run);
    unlink(SAVED);
    return 0;
}
