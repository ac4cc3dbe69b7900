//! What one-VMA-per-page merges cost the host: kernel memory per VMA, mmap
//! cost as the VMA count grows, fault latency with many VMAs, teardown and
//! `/proc/self/maps` read time (the engine's headroom check).
//!
//! `cargo bench -p pagefold-dedup --bench vma_cost -- [--reps R] [--samples S] [N ...]`
//!
//! N is a page (= VMA) count, `64k`, `256k`, `1M` by default; R = 3 runs per
//! N (min / median / max printed), S = 10000 sampled pages per fault kind.
//! For each N: an anonymous private region of N touched pages, then the
//! pages of a populated memfd pool are mapped over it with
//! `mmap(MAP_FIXED|MAP_PRIVATE)`, page i at pool offset perm[i] (a random
//! permutation: every page its own VMA). The reference is the same region
//! with ONE `mmap` of consecutive pool offsets (1 VMA).
//!
//! Needs root: it raises `vm.max_map_count` to 2 Mi for the run and restores
//! the original value on exit, on panic and on SIGINT/SIGTERM (the original
//! is printed first, for a human to restore after a SIGKILL).
//!
//! Fault samples: read samples lie in distinct 64 KiB-aligned 16-page blocks
//! and write samples in other blocks, so the 1-VMA reference's fault-around
//! (up to 16 PTEs per read fault of a file mapping) never pre-maps a sample;
//! with N = 64k there are only 4096 blocks, so 2048 read samples.
//! Page tables are this process's VmPTE; the global counters
//! (/proc/meminfo Slab/SUnreclaim, /proc/slabinfo) see the other processes
//! of the host too.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pagefold_dedup::mm;

const PS: usize = 4096;
const CHUNK: usize = 65536;
const FAULT_AROUND_PAGES: usize = 16;
const MAP_COUNT: &str = "/proc/sys/vm/max_map_count";
const RAISED: u64 = 2 * 1024 * 1024;

/// Original `vm.max_map_count`; 0 = nothing to restore.
static ORIGINAL: AtomicU64 = AtomicU64::new(0);

/// Writes ORIGINAL back; async-signal-safe (no allocation, raw syscalls).
fn restore_map_count() {
    let v = ORIGINAL.load(Ordering::SeqCst);
    if v == 0 {
        return;
    }
    let mut buf = [0u8; 24];
    let mut i = buf.len() - 1;
    buf[i] = b'\n';
    let mut x = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    // SAFETY: open/write/close with a NUL-terminated literal path and a
    // buffer on our stack; all three are async-signal-safe.
    unsafe {
        let fd = libc::open(c"/proc/sys/vm/max_map_count".as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::write(fd, buf[i..].as_ptr().cast(), buf.len() - i);
            libc::close(fd);
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    restore_map_count();
    // SAFETY: back to the default action and re-raise, so the process ends
    // of the signal as it would have without us.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Raises `vm.max_map_count` while alive; Drop, a panic hook and a
/// SIGINT/SIGTERM handler put the original back.
struct MapCountGuard {
    /// The journal's record (docs/global-state.md): a `kill -9` is undone
    /// by the next pagefold that uses KSM or `pagefold ksm restore`.
    _journal: pagefold_dedup::ksm::journal::KnobGuard,
}

impl MapCountGuard {
    fn raise() -> Result<Self, String> {
        let s = std::fs::read_to_string(MAP_COUNT).map_err(|e| format!("{MAP_COUNT}: {e}"))?;
        let orig: u64 = s
            .trim()
            .parse()
            .map_err(|e| format!("{MAP_COUNT} {s:?}: {e}"))?;
        println!(
            "original vm.max_map_count = {orig} (if this run is killed: echo {orig} > {MAP_COUNT})"
        );
        ORIGINAL.store(orig, Ordering::SeqCst);
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs a handler that only makes async-signal-safe calls.
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_map_count();
            prev(info);
        }));
        let journal = pagefold_dedup::ksm::journal::raise_sysctl("vm.max_map_count", RAISED)
            .map_err(|e| format!("raise {MAP_COUNT}: {e} (root needed)"))?;
        Ok(Self { _journal: journal })
    }
}

impl Drop for MapCountGuard {
    fn drop(&mut self) {
        restore_map_count();
        let now = std::fs::read_to_string(MAP_COUNT).unwrap_or_default();
        eprintln!("vm.max_map_count restored: {}", now.trim());
    }
}

/// splitmix64
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Fisher-Yates over the first `k` positions.
    fn shuffle_prefix(&mut self, v: &mut [usize], k: usize) {
        for i in 0..k.min(v.len()) {
            let j = i + self.below(v.len() - i);
            v.swap(i, j);
        }
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An anonymous private region of `n` pages, every page written once.
fn touched_region(n: usize) -> Result<usize, String> {
    let base = mm::map_anon(n * PS).map_err(|e| format!("region of {n} pages: {e}"))? as usize;
    // SAFETY: the mapping just made; MADV_NOHUGEPAGE changes no content.
    unsafe { mm::madvise(base, n * PS, libc::MADV_NOHUGEPAGE) }.map_err(|e| e.to_string())?;
    for i in 0..n {
        // SAFETY: inside the mapping just made.
        unsafe { std::ptr::write_volatile((base + i * PS) as *mut u64, 1) };
    }
    Ok(base)
}

fn map_pool(addr: usize, pages: usize, pool: i32, off_page: usize) -> Result<(), String> {
    // SAFETY: the engine's merge primitive, over page-aligned pages of a
    // region of our own (`touched_region`: nothing else lives there); no
    // reference into it exists, and the measurement reads it only through
    // raw pointers, expecting the pool's content. The pool fd is open and
    // at least off_page + pages long.
    unsafe { mm::map_pool_fixed(addr, pages * PS, pool, (off_page * PS) as u64) }
        .map_err(|e| format!("pool page {off_page}: {e}"))
}

/// A memfd of `n` pages, pool page k holding k + 1 in its first word.
fn make_pool(n: usize) -> Result<i32, String> {
    // SAFETY: NUL-terminated literal name.
    let fd = unsafe { libc::memfd_create(c"vma_cost_pool".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", errno()));
    }
    // SAFETY: our fd.
    if unsafe { libc::ftruncate(fd, (n * PS) as libc::off_t) } != 0 {
        return Err(format!("ftruncate pool: {}", errno()));
    }
    // SAFETY: shared mapping of our memfd, kernel-chosen address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n * PS,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap pool: {}", errno()));
    }
    for k in 0..n {
        // SAFETY: inside the pool mapping.
        unsafe { std::ptr::write_volatile((p as usize + k * PS) as *mut u64, k as u64 + 1) };
    }
    // SAFETY: unmapping the mapping made above; the pages stay in the memfd.
    unsafe { libc::munmap(p, n * PS) };
    Ok(fd)
}

fn munmap_timed(addr: usize, n: usize) -> Result<(f64, f64), String> {
    let (t, c) = (Instant::now(), thread_cpu_ns());
    // SAFETY: the whole region is ours and no reference into it is kept.
    let r = unsafe { libc::munmap(addr as *mut libc::c_void, n * PS) };
    let out = (
        t.elapsed().as_secs_f64() * 1e3,
        (thread_cpu_ns() - c) as f64 / 1e6,
    );
    if r != 0 {
        return Err(format!("munmap: {}", errno()));
    }
    Ok(out)
}

/// (kB) this process's page tables (VmPTE in /proc/self/status).
fn vm_pte_kb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmPTE:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// (kB) Slab, SUnreclaim.
fn meminfo() -> [f64; 2] {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mut out = [0.0; 2];
    for line in s.lines() {
        let mut it = line.split_whitespace();
        let (k, v) = (
            it.next().unwrap_or(""),
            it.next().and_then(|v| v.parse().ok()),
        );
        let idx = match k {
            "Slab:" => 0,
            "SUnreclaim:" => 1,
            _ => continue,
        };
        out[idx] = v.unwrap_or(0.0);
    }
    out
}

const SLABS: [&str; 4] = ["vm_area_struct", "maple_node", "anon_vma", "anon_vma_chain"];

/// Bytes of active objects of the caches in SLABS.
fn slabinfo() -> HashMap<&'static str, f64> {
    let s = std::fs::read_to_string("/proc/slabinfo").unwrap_or_default();
    let mut out = HashMap::new();
    for line in s.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let Some(name) = SLABS.iter().find(|n| f.first() == Some(*n)) {
            let active: f64 = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let size: f64 = f.get(3).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            out.insert(*name, active * size);
        }
    }
    out
}

fn slab_delta(a: &HashMap<&str, f64>, b: &HashMap<&str, f64>, name: &str) -> f64 {
    b.get(name).copied().unwrap_or(0.0) - a.get(name).copied().unwrap_or(0.0)
}

/// (wall ms, CPU ms, lines, bytes) of one full read of /proc/self/maps.
fn read_maps() -> (f64, f64, usize, usize) {
    let mut buf = Vec::with_capacity(1 << 20);
    let (t, c) = (Instant::now(), thread_cpu_ns());
    let mut f = std::fs::File::open("/proc/self/maps").expect("open /proc/self/maps");
    f.read_to_end(&mut buf).expect("read /proc/self/maps");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let cpu = (thread_cpu_ns() - c) as f64 / 1e6;
    (
        ms,
        cpu,
        buf.iter().filter(|&&b| b == b'\n').count(),
        buf.len(),
    )
}

struct Samples {
    read: Vec<usize>,
    write: Vec<usize>,
}

fn samples(n: usize, want: usize, rng: &mut Rng) -> Samples {
    let blocks = n / FAULT_AROUND_PAGES;
    let mut b: Vec<usize> = (0..blocks).collect();
    let nr = want.min(blocks / 2);
    rng.shuffle_prefix(&mut b, blocks);
    let read = b[..nr]
        .iter()
        .map(|blk| blk * FAULT_AROUND_PAGES + rng.below(FAULT_AROUND_PAGES))
        .collect();
    let mut rest: Vec<usize> = b[nr..]
        .iter()
        .flat_map(|blk| blk * FAULT_AROUND_PAGES..(blk + 1) * FAULT_AROUND_PAGES)
        .collect();
    let nw = want.min(rest.len());
    rng.shuffle_prefix(&mut rest, nw);
    rest.truncate(nw);
    Samples { read, write: rest }
}

/// (wall, CPU) ns per first read of each sampled page; checks the value is
/// `expect(i)`.
fn read_faults(
    base: usize,
    idx: &[usize],
    expect: impl Fn(usize) -> u64,
) -> Result<(f64, f64), String> {
    let mut sum = 0u64;
    let (t, c) = (Instant::now(), thread_cpu_ns());
    for &i in idx {
        // SAFETY: i < N, inside the mapped region.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile((base + i * PS) as *const u64) });
    }
    let ns = t.elapsed().as_nanos() as f64 / idx.len() as f64;
    let cpu = (thread_cpu_ns() - c) as f64 / idx.len() as f64;
    let want = idx.iter().fold(0u64, |s, &i| s.wrapping_add(expect(i)));
    if sum != want {
        return Err(format!(
            "read faults: page contents sum {sum:#x}, pool says {want:#x}"
        ));
    }
    Ok((ns, cpu))
}

/// (wall, CPU) ns per first write (COW) of each sampled page.
fn write_faults(base: usize, idx: &[usize]) -> (f64, f64) {
    let (t, c) = (Instant::now(), thread_cpu_ns());
    for &i in idx {
        // SAFETY: i < N, inside the mapped (private, writable) region.
        unsafe { std::ptr::write_volatile((base + i * PS + 8) as *mut u64, 0x5a) };
    }
    let k = idx.len() as f64;
    (
        t.elapsed().as_nanos() as f64 / k,
        (thread_cpu_ns() - c) as f64 / k,
    )
}

/// (label, decimals)
const METRICS: &[(&str, usize)] = &[
    ("VMAs in the process after mapping", 0),
    ("Slab delta per VMA (B)", 0),
    ("SUnreclaim delta per VMA (B)", 0),
    ("vm_area_struct bytes per VMA", 0),
    ("maple_node bytes per VMA", 1),
    ("SUnreclaim delta for all N VMAs (MiB)", 1),
    ("VmPTE delta of this process, mapping + faults (KiB)", 0),
    ("anon_vma + anon_vma_chain bytes per COWed 1-page VMA", 0),
    ("mmap wall us/call, all N", 2),
    ("mmap wall us/call, first 64k VMAs", 2),
    ("mmap wall us/call, last 64k VMAs", 2),
    ("mmap CPU us/call, first 64k VMAs", 2),
    ("mmap CPU us/call, last 64k VMAs", 2),
    ("read fault ns (wall), N VMAs", 0),
    ("read fault ns (CPU), N VMAs", 0),
    ("read fault ns (wall), 1 VMA (fault-around maps 16)", 0),
    ("read fault ns (CPU), 1 VMA (fault-around maps 16)", 0),
    ("COW write fault ns (wall), N VMAs", 0),
    ("COW write fault ns (CPU), N VMAs", 0),
    ("COW write fault ns (wall), 1 VMA", 0),
    ("COW write fault ns (CPU), 1 VMA", 0),
    ("munmap whole region ms (wall), N VMAs", 1),
    ("munmap whole region ms (CPU), N VMAs", 1),
    ("munmap whole region ms (wall), 1 VMA", 1),
    ("munmap whole region ms (CPU), 1 VMA", 1),
    ("/proc/self/maps read ms (wall), N VMAs", 1),
    ("/proc/self/maps read ms (CPU), N VMAs", 1),
    ("/proc/self/maps size MiB, N VMAs", 1),
    ("/proc/self/maps read ms (wall), 1 VMA", 3),
];

fn run_one(n: usize, pool: i32, want: usize, rng: &mut Rng) -> Result<Vec<f64>, String> {
    let mut perm: Vec<usize> = (0..n).collect();
    rng.shuffle_prefix(&mut perm, n);
    let smp = samples(n, want, rng);

    // --- N VMAs ---
    let base = touched_region(n)?;
    let (m0, s0, pte0) = (meminfo(), slabinfo(), vm_pte_kb());
    let mut marks = Vec::with_capacity(n / CHUNK + 2);
    marks.push((0usize, Instant::now(), thread_cpu_ns()));
    let t_all = Instant::now();
    for (i, &off) in perm.iter().enumerate() {
        map_pool(base + i * PS, 1, pool, off)
            .map_err(|e| format!("{e} (after {i} one-page VMAs)"))?;
        if (i + 1) % CHUNK == 0 || i + 1 == n {
            marks.push((i + 1, Instant::now(), thread_cpu_ns()));
        }
    }
    let map_all = t_all.elapsed().as_secs_f64() * 1e6 / n as f64;
    let (m1, s1) = (meminfo(), slabinfo());
    let per_call = |a: usize| {
        let ((i0, t0, c0), (i1, t1, c1)) = (marks[a], marks[a + 1]);
        let k = (i1 - i0) as f64;
        (
            t1.duration_since(t0).as_secs_f64() * 1e6 / k,
            (c1 - c0) as f64 / 1e3 / k,
        )
    };
    let (first_w, first_c) = per_call(0);
    let (last_w, last_c) = per_call(marks.len() - 2);

    let rd = read_faults(base, &smp.read, |i| perm[i] as u64 + 1)?;
    let s2 = slabinfo();
    let wr = write_faults(base, &smp.write);
    let (s3, pte3) = (slabinfo(), vm_pte_kb());
    let (maps_ms, maps_cpu, vmas, maps_bytes) = read_maps();
    let (unmap_ms, unmap_cpu) = munmap_timed(base, n)?;

    let nf = n as f64;
    let vma_b = slab_delta(&s0, &s1, "vm_area_struct") / nf;
    let maple_b = slab_delta(&s0, &s1, "maple_node") / nf;
    let anon_b = (slab_delta(&s2, &s3, "anon_vma") + slab_delta(&s2, &s3, "anon_vma_chain"))
        / smp.write.len() as f64;

    // --- reference: the same region as 1 VMA over consecutive pool offsets ---
    let base1 = touched_region(n)?;
    map_pool(base1, n, pool, 0)?;
    let rd1 = read_faults(base1, &smp.read, |i| i as u64 + 1)?;
    let wr1 = write_faults(base1, &smp.write);
    let (maps1_ms, _, _, _) = read_maps();
    let (unmap1_ms, unmap1_cpu) = munmap_timed(base1, n)?;

    Ok(vec![
        vmas as f64,
        (m1[0] - m0[0]) * 1024.0 / nf,
        (m1[1] - m0[1]) * 1024.0 / nf,
        vma_b,
        maple_b,
        (m1[1] - m0[1]) / 1024.0,
        pte3 - pte0,
        anon_b,
        map_all,
        first_w,
        last_w,
        first_c,
        last_c,
        rd.0,
        rd.1,
        rd1.0,
        rd1.1,
        wr.0,
        wr.1,
        wr1.0,
        wr1.1,
        unmap_ms,
        unmap_cpu,
        unmap1_ms,
        unmap1_cpu,
        maps_ms,
        maps_cpu,
        maps_bytes as f64 / (1 << 20) as f64,
        maps1_ms,
    ])
}

fn parse_pages(s: &str) -> Option<usize> {
    let (num, mul) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|v| v * mul)
}

fn label(n: usize) -> String {
    if n % (1 << 20) == 0 {
        format!("{}M", n >> 20)
    } else if n % 1024 == 0 {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

fn min_med_max(v: &[f64], prec: usize) -> String {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let med = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    format!(
        "{:.p$} / {:.p$} / {:.p$}",
        s[0],
        med,
        s[s.len() - 1],
        p = prec
    )
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("vma_cost: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), String> {
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench binaries too: this one takes
        // minutes and changes a sysctl, so only `cargo bench` runs it.
        println!("vma_cost: skipped (run it with cargo bench)");
        return Ok(());
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let (mut reps, mut want, mut sizes) = (3usize, 10_000usize, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).ok_or("--reps R")?,
            "--samples" => {
                want = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--samples S")?
            }
            s => sizes.push(parse_pages(s).ok_or(format!("bad page count {s:?}"))?),
        }
    }
    if sizes.is_empty() {
        sizes = vec![64 << 10, 256 << 10, 1 << 20];
    }
    if reps == 0 || sizes.iter().any(|&n| n < 2 * FAULT_AROUND_PAGES) {
        return Err("need reps >= 1 and N >= 32".into());
    }
    let cmd = if args.is_empty() {
        "cargo bench -p pagefold-dedup --bench vma_cost".to_string()
    } else {
        format!(
            "cargo bench -p pagefold-dedup --bench vma_cost -- {}",
            args.join(" ")
        )
    };
    let uname = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load0 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let _guard = MapCountGuard::raise()?;
    let max_n = *sizes.iter().max().unwrap_or(&0);
    let pool = make_pool(max_n)?;
    let mut rng = Rng(0x5EED_0F7A_6E00);
    // results[n][metric][rep]
    let mut res = vec![vec![Vec::with_capacity(reps); METRICS.len()]; sizes.len()];
    for rep in 0..reps {
        for (ni, &n) in sizes.iter().enumerate() {
            let t = Instant::now();
            let v = run_one(n, pool, want, &mut rng)?;
            eprintln!(
                "rep {}/{reps} N={}: {:.1} s",
                rep + 1,
                label(n),
                t.elapsed().as_secs_f64()
            );
            for (m, x) in v.into_iter().enumerate() {
                res[ni][m].push(x);
            }
        }
    }
    // SAFETY: our fd, no mapping of it is left.
    unsafe { libc::close(pool) };
    let load1 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    println!("\n`{cmd}`\n");
    println!(
        "Linux {}, {} CPUs, loadavg at start {} / end {}; {reps} runs per N: min / median / max; \
         {} read + {} write fault samples at N = {}",
        uname.trim(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load0
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        load1
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        want.min(sizes[sizes.len() - 1] / FAULT_AROUND_PAGES / 2),
        want,
        label(sizes[sizes.len() - 1]),
    );
    println!();
    let mut head = "| metric |".to_string();
    let mut sep = "|---|".to_string();
    for &n in &sizes {
        head += &format!(" N = {} |", label(n));
        sep += "---|";
    }
    println!("{head}\n{sep}");
    for (m, (name, prec)) in METRICS.iter().enumerate() {
        let mut row = format!("| {name} |");
        for r in &res {
            row += &format!(" {} |", min_med_max(&r[m], *prec));
        }
        println!("{row}");
    }
    Ok(())
}
