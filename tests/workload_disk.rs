//! The workload guest's virtio-blk driver: a test image read through
//! virtio-mmio into the guest's disk area, checked byte for byte by the guest
//! and by checksum against the host's reading of the same file; a corrupted
//! byte must show as a mismatch; two VMs reading one image hold identical
//! page-cache pages.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use pagefold_guest_abi::disk::{checksum_bytes, image_page_bytes};
use pagefold_guest_abi::PAGE_SIZE;

const LIMIT: Duration = Duration::from_secs(120);
const SEED: u64 = 0x5eed;
/// 6 MiB of pages plus a partial page (not read: the guest reads whole pages).
const PAGES: u64 = 1536;

/// Writes the test image made with `seed`: `pages` generator pages and a
/// 100-byte tail.
fn make_image(path: &Path, seed: u64, pages: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(((pages + 1) * PAGE_SIZE) as usize);
    let mut page = [0u8; PAGE_SIZE as usize];
    for k in 0..pages {
        image_page_bytes(seed, k, &mut page);
        bytes.extend_from_slice(&page);
    }
    bytes.extend_from_slice(&[0xa5; 100]);
    std::fs::write(path, &bytes).unwrap();
    bytes
}

/// The checksum a VM's guest logged for its disk-read (stdout line
/// `[vm] guest: disk-read: ... checksum 0x...`, or without the prefix when
/// one VM runs).
fn logged_checksums(out: &str) -> Vec<(String, u64)> {
    out.lines()
        .filter(|l| l.contains("guest: disk-read: disk 0"))
        .map(|l| {
            let vm = l.split(':').next().unwrap_or("").trim().to_string();
            let hex = l
                .split("checksum 0x")
                .nth(1)
                .and_then(|t| t.get(..16))
                .unwrap_or_else(|| panic!("no checksum in {l:?}"));
            (vm, u64::from_str_radix(hex, 16).unwrap())
        })
        .collect()
}

fn run_one(image: &Path, dir: &TempDir) -> (std::process::Output, serde_json::Value) {
    let json = dir.path("report.json");
    let disk = format!("{},ro", image.display());
    let o = run(
        &[
            "run",
            "--name",
            "reader",
            "--memory",
            "64M",
            "--shared",
            "8M",
            "--private",
            "4M",
            "--phases",
            "fill,disk-read,verify",
            "--disk",
            &disk,
            "--disk-seed",
            &SEED.to_string(),
            "--json-file",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    let r = read_json(&json);
    (o, r)
}

#[test]
fn reads_a_test_image_and_checks_every_byte() {
    require_kvm();
    let dir = TempDir::new("disk-read");
    let img = dir.path("disk.img");
    let bytes = make_image(&img, SEED, PAGES);
    let (o, r) = run_one(&img, &dir);
    assert!(o.status.success(), "{}", text(&o));
    let v = vm(&r, "reader");
    assert_eq!(v["exit_status"], 0, "{v}");
    assert_eq!(v["mismatches"], 0, "{v}");
    let read = phases(v, "disk-read");
    assert_eq!(read.len(), 1, "{v}");
    assert_eq!(read[0]["pages"], PAGES, "{v}");
    assert_eq!(read[0]["bytes"], PAGES * PAGE_SIZE, "{v}");
    assert_eq!(read[0]["mismatches"], 0, "{v}");
    assert_eq!(read[0]["zero_pages"], 0, "{v}");
    // The guest's checksum of what it read is the host's of the file.
    let out = String::from_utf8_lossy(&o.stdout);
    let sums = logged_checksums(&out);
    assert_eq!(sums.len(), 1, "{out}");
    assert_eq!(sums[0].1, checksum_bytes(&bytes), "{out}");
    // Reading did not disturb the workload's own pages.
    assert_eq!(phases(v, "verify")[0]["mismatches"], 0);
}

#[test]
fn a_corrupted_image_byte_is_a_mismatch() {
    require_kvm();
    let dir = TempDir::new("disk-bad");
    let img = dir.path("disk.img");
    let mut bytes = make_image(&img, SEED, PAGES);
    let good = checksum_bytes(&bytes);
    let (page, byte) = (1000u64, 1234usize);
    bytes[(page * PAGE_SIZE) as usize + byte] ^= 0x10;
    std::fs::write(&img, &bytes).unwrap();
    let (o, r) = run_one(&img, &dir);
    // The guest reports the mismatch and exits with MISMATCH (1).
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = vm(&r, "reader");
    assert_eq!(v["exit_status"], 1, "{v}");
    assert_eq!(phases(v, "disk-read")[0]["mismatches"], 1, "{v}");
    let out = String::from_utf8_lossy(&o.stdout);
    let word = byte / 8;
    assert!(
        out.contains(&format!("first mismatch: page {page} word {word}:")),
        "{out}"
    );
    let sums = logged_checksums(&out);
    assert_eq!(sums[0].1, checksum_bytes(&bytes), "{out}");
    assert_ne!(sums[0].1, good);
}

#[test]
fn two_vms_reading_one_image_hold_identical_pages() {
    two_vms_read_one_image("");
}

/// As [`two_vms_reading_one_image_hold_identical_pages`], with each VM's
/// page cache scattered in extents of 8 pages by its own permutation (each
/// virtio request covers one extent at most); every byte still checks.
#[test]
fn two_scattered_vms_reading_one_image_hold_identical_pages() {
    two_vms_read_one_image("placement = \"scattered\"\nextent_pages = 8");
}

fn two_vms_read_one_image(workload: &str) {
    require_kvm();
    let dir = TempDir::new("disk-two");
    let img = dir.path("disk.img");
    let bytes = make_image(&img, SEED, PAGES);
    let cfg = dir.path("two.toml");
    let vm = |name: &str, seed: u64| {
        format!(
            r#"
            [[vm]]
            name = "{name}"
            memory = "64M"
            [vm.workload]
            seed = {seed}
            shared = "4M"
            private = "4M"
            phases = ["fill", "disk-read", "verify"]
            disk_seed = {SEED}
            disks = [{{ path = {path:?}, readonly = true }}]
            {workload}
            "#,
            path = img.display().to_string()
        )
    };
    // Different workload seeds: only the disk pages have reason to match.
    std::fs::write(&cfg, format!("{}{}", vm("left", 1), vm("right", 2))).unwrap();
    let json = dir.path("report.json");
    let o = run_config(&cfg, &json, LIMIT);
    assert!(o.status.success(), "{}", text(&o));
    let r = read_json(&json);
    for name in ["left", "right"] {
        let v = common::vm(&r, name);
        assert_eq!(v["exit_status"], 0, "{v}");
        assert_eq!(phases(v, "disk-read")[0]["pages"], PAGES, "{v}");
    }
    let out = String::from_utf8_lossy(&o.stdout);
    let mut sums = logged_checksums(&out);
    sums.sort();
    assert_eq!(sums.len(), 2, "{out}");
    assert!(
        sums[0].0.contains("left") && sums[1].0.contains("right"),
        "{sums:?}"
    );
    // Same checksum in both guests, and it is the file's: the two page
    // caches hold the same bytes at the same disk offsets, page-aligned.
    assert_eq!(sums[0].1, sums[1].1, "{out}");
    assert_eq!(sums[0].1, checksum_bytes(&bytes));
}

/// Two VMs in one dedup group read the same test image: their disk areas
/// hold the image byte for byte (read back from guest memory), the ABI
/// predicts exactly that much sharing, and once the engine settles every
/// disk page of one VM is on the same physical frame as the other's.
///
/// The checks run in the runner's tick hook: virtio notifications are
/// served by the event loop of `Runner::run` (ioeventfd), which
/// `Runner::poll_events` does not run.
#[test]
fn dedup_merges_the_page_caches_of_two_vms() {
    dedup_merges_page_caches("");
}

/// As [`dedup_merges_the_page_caches_of_two_vms`], with each VM's disk
/// area scattered page by page by its own permutation: the image's pages
/// sit at unrelated addresses in the two VMs and still all merge.
#[test]
fn dedup_merges_the_scattered_page_caches_of_two_vms() {
    dedup_merges_page_caches("placement = \"scattered\"\nextent_pages = 1");
}

/// A 64 MiB VM in group "g" that reads the test image into its page cache
/// and waits; `workload` adds keys to its `[vm.workload]` table.
fn page_cache_vm(name: &str, seed: u64, img: &Path, workload: &str) -> String {
    format!(
        r#"
            [[vm]]
            name = "{name}"
            memory = "64M"
            serial = "null"
            dedup = {{ group = "g" }}
            [vm.workload]
            seed = {seed}
            shared = "4M"
            private = "4M"
            phases = ["fill", "disk-read", "wait:60000", "verify"]
            disk_seed = {SEED}
            disks = [{{ path = {path:?}, readonly = true }}]
            {workload}
            "#,
        path = img.display().to_string()
    )
}

fn dedup_merges_page_caches(workload: &str) {
    use common::dedup::{release, start};
    let dir = TempDir::new("disk-dedup");
    let img = dir.path("disk.img");
    let bytes = make_image(&img, SEED, PAGES);
    let vm = |name: &str, seed: u64| page_cache_vm(name, seed, &img, workload);
    let cfg = format!(
        "[dedup]\nmode = \"on\"\npages_to_scan = 10000\nsleep_millisecs = 0\n{}{}",
        vm("a", 1),
        vm("b", 2)
    );
    let mut r = start(&cfg);
    let mut checked = false;
    let report = r
        .run(|r| {
            let read = r
                .vms()
                .iter()
                .all(|v| r.summary(v.name()).is_some_and(|s| s.phases.len() >= 2));
            if checked || !read {
                return;
            }
            checked = true;
            check_merged(r, &bytes);
            release(r);
        })
        .expect("run");
    assert!(
        checked,
        "the guests never finished disk-read: {:?}",
        report.vms.iter().map(|v| &v.outcome).collect::<Vec<_>>()
    );
    for v in &report.vms {
        assert_eq!(v.exit_status, Some(0), "{} {:?}", v.name, v.outcome);
        assert_eq!(v.mismatches, 0, "{}", v.name);
    }
}

/// The checks of `dedup_merges_the_page_caches_of_two_vms`, while both
/// guests wait after their disk-read.
fn check_merged(r: &pagefold_vmm::runner::Runner, bytes: &[u8]) {
    use common::dedup::*;
    use pagefold_guest_abi::classes::DataLayout;
    use pagefold_guest_abi::Placement;
    use std::os::unix::fs::FileExt;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

    const T: Duration = Duration::from_secs(90);
    let settled = wait_settled(r, 12, T);
    let (a, b) = (&r.vms()[0], &r.vms()[1]);
    // Different workload seeds and private seeds, no zero or duplicate
    // pages: the disk pages are all the sharing the ABI predicts.
    let e = expectation(&[a, b]);
    assert_eq!(e.disk_pages, 2 * PAGES);
    assert_eq!(e.sharing_pages, PAGES, "{e:?}");
    assert!(
        settled.pages_sharing >= e.sharing_pages,
        "{settled:?} vs {e:?}"
    );
    let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    let pfn = |vm: &pagefold_vmm::vm::Vm, gpa: u64| {
        let host = vm.memory().get_host_address(GuestAddress(gpa)).unwrap() as u64;
        let mut e = [0u8; 8];
        pagemap.read_exact_at(&mut e, host / PAGE_SIZE * 8).unwrap();
        u64::from_le_bytes(e) & ((1 << 55) - 1)
    };
    let la = DataLayout::new(a.workload_params().unwrap()).unwrap();
    let lb = DataLayout::new(b.workload_params().unwrap()).unwrap();
    assert_eq!(
        la.placement == lb.placement,
        la.placement == Placement::Linear
    );
    if la.placement != Placement::Linear {
        let same = (0..PAGES)
            .filter(|&k| la.disk_page_gpa(k) == lb.disk_page_gpa(k))
            .count();
        assert!(same < 20, "{same} disk pages at the same GPA in both VMs");
    }
    let mut page_a = vec![0u8; PAGE_SIZE as usize];
    let mut page_b = vec![0u8; PAGE_SIZE as usize];
    let mut same_frame = 0;
    for k in 0..PAGES {
        let (ga, gb) = (la.disk_page_gpa(k), lb.disk_page_gpa(k));
        a.memory()
            .read_slice(&mut page_a, GuestAddress(ga))
            .unwrap();
        b.memory()
            .read_slice(&mut page_b, GuestAddress(gb))
            .unwrap();
        let file = &bytes[(k * PAGE_SIZE) as usize..((k + 1) * PAGE_SIZE) as usize];
        assert!(
            page_a == file && page_b == file,
            "disk page {k} differs from the image"
        );
        let (fa, fb) = (pfn(a, ga), pfn(b, gb));
        if fa != 0 && fa == fb {
            same_frame += 1;
        }
    }
    assert_eq!(
        same_frame, PAGES,
        "disk pages on one frame in both VMs ({settled:?})"
    );
}

/// I/O hints: with an engine this slow (64 pages per 200 ms: a regular pass
/// over two 64 MiB VMs takes ~100 s, and merging needs two), the two page
/// caches, at unrelated addresses, still merge within seconds of the reads,
/// and the engine says the hints did it. With `io_hints = false`, the same
/// run merges none of them in that time.
#[test]
fn io_hints_merge_page_caches_read_by_two_vms_at_once() {
    for hints in [true, false] {
        page_caches_with_hints(hints);
    }
}

fn page_caches_with_hints(hints: bool) {
    use common::dedup::{release, start, stats};
    let dir = TempDir::new("disk-hints");
    let img = dir.path("disk.img");
    make_image(&img, SEED, PAGES);
    let vm = |name: &str, seed: u64| page_cache_vm(name, seed, &img, "placement = \"scattered\"");
    let cfg = format!(
        "[dedup]\nmode = \"on\"\npages_to_scan = 64\nsleep_millisecs = 200\nio_hints = {hints}\n{}{}",
        vm("a", 1),
        vm("b", 2)
    );
    let mut r = start(&cfg);
    let mut seen: Option<pagefold_dedup::Stats> = None;
    let mut read_at: Option<Instant> = None;
    let report = r
        .run(|r| {
            if seen.is_some() {
                return;
            }
            let read = r
                .vms()
                .iter()
                .all(|v| r.summary(v.name()).is_some_and(|s| s.phases.len() >= 2));
            if !read {
                return;
            }
            let t = *read_at.get_or_insert_with(Instant::now);
            let s = stats(r);
            // Every disk page of one VM shares with the other's.
            if s.pages_sharing >= PAGES || t.elapsed() > Duration::from_secs(3) {
                seen = Some(s);
                release(r);
            }
        })
        .expect("run");
    let s = seen.expect("the guests never finished disk-read");
    for v in &report.vms {
        assert_eq!(v.exit_status, Some(0), "{} {:?}", v.name, v.outcome);
        assert_eq!(v.mismatches, 0, "{}", v.name);
    }
    assert!(s.hints > 0, "virtio-blk reads were not reported: {s:?}");
    if hints {
        assert!(
            s.pages_sharing >= PAGES && s.hint_merges >= PAGES,
            "page caches not merged by hints within 3 s of the reads: {s:?}"
        );
        assert!(s.hint_merge_delay_ms < 1000.0, "{s:?}");
    } else {
        assert_eq!(s.hint_merges, 0, "{s:?}");
        assert!(
            s.pages_sharing < PAGES / 4,
            "the slow regular scan alone merged the caches: {s:?}"
        );
    }
}
