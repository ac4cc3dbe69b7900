//! The host memory guests cost, read from the host kernel the same way
//! for every system, without touching a guest page: the distinct frames
//! that the guests' RAM and the dedup pool map (`/proc/self/pagemap`),
//! the kernel's zero page not counted.
//!
//! Why frames and not a process's RSS: RSS counts a frame once per
//! mapping (a pool page merged into 200 guest pages would count 200
//! times, plus its pool view), so it cannot show a merger's saving; and
//! the process's other memory (the binary, the engine's books) is not
//! what guests cost. Why the pool's view too: a merged guest page that
//! has not been read since its merge is not present in guest RAM (the
//! kernel maps it on the next access), but its pool page holds memory;
//! the engine keeps every pool page it wrote mapped in a shared view of
//! its memfd (`/memfd:pagefold-pool`), so counting the view's frames with
//! guest RAM's, each once, counts every pool page once. Kernel KSM's
//! merged pages are in guest RAM and count once however many pages map
//! them. The process's PSS (`smaps_rollup`), which divides each frame
//! among its mappings, is read beside it as a cross-check.

use std::io;

use pagefold_dedup::pagemap::{Entry, Pagemap};
use pagefold_dedup::PAGE_SIZE;

/// Errors reading the host's figures.
#[derive(Debug, thiserror::Error)]
pub enum FramesError {
    #[error("pagemap: {0}")]
    Pagemap(#[from] pagefold_dedup::pagemap::PagemapError),
    #[error("reading {path}: {source}")]
    Read {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    /// pagemap shows no frame numbers without `CAP_SYS_ADMIN`.
    #[error("pagemap hides frame numbers (not root)")]
    NoFrames,
    #[error("no Pss line in {0}")]
    NoPss(&'static str),
}

/// What the engine's pool memfd is called in `/proc/self/maps`.
const POOL_NAME: &str = "/memfd:pagefold-pool";
/// Pages per pagemap read.
const CHUNK_PAGES: usize = 4096;

/// The shared mappings of the dedup pool in `maps` (the text of
/// `/proc/self/maps`): the engine's views of its memfd, as (start, len,
/// inode). The private mappings of the pool are merged guest pages,
/// inside guest RAM's ranges already.
pub fn pool_views(maps: &str) -> Vec<(usize, usize, u64)> {
    maps.lines()
        .filter_map(|line| {
            let mut w = line.split_whitespace();
            let (range, perms) = (w.next()?, w.next()?);
            // offset, device, inode, then the path (which may hold spaces).
            let inode: u64 = w.nth(2)?.parse().ok()?;
            let path = w.next()?;
            if !path.starts_with(POOL_NAME) || perms.as_bytes().get(3) != Some(&b's') {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let start = usize::from_str_radix(a, 16).ok()?;
            let end = usize::from_str_radix(b, 16).ok()?;
            (end > start).then_some((start, end - start, inode))
        })
        .collect()
}

/// The pool memfds this process holds open: (inode, file size in bytes),
/// from `/proc/self/fd`. A view is reserved for the pool's largest size
/// (a terabyte, `MAP_NORESERVE`) but only the file's pages can be
/// present: reading pagemap beyond them would take seconds for nothing.
fn pool_files() -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let path = e.ok()?.path();
        let link = std::fs::read_link(&path).ok()?;
        if !link.to_string_lossy().starts_with(POOL_NAME) {
            return None;
        }
        let m = std::fs::metadata(&path).ok()?;
        Some((m.ino(), m.size()))
    })
    .collect()
}

/// `views` cut to the size of their files (`files`: inode, bytes); a
/// view whose file is not open here is left out.
pub fn clip_views(views: &[(usize, usize, u64)], files: &[(u64, u64)]) -> Vec<(usize, usize)> {
    views
        .iter()
        .filter_map(|&(start, len, ino)| {
            let (_, size) = files.iter().find(|(i, _)| *i == ino)?;
            let len = len.min(usize::try_from(*size).ok()?);
            (len > 0).then_some((start, len))
        })
        .collect()
}

/// How many distinct values `pfns` holds (sorted in place).
pub fn distinct(pfns: &mut Vec<u64>) -> u64 {
    pfns.sort_unstable();
    pfns.dedup();
    pfns.len() as u64
}

/// The distinct frames other than the kernel's zero page that `ranges`
/// (guest RAM of this process) and the pool's views map now. Reads only
/// pagemap: no page is touched, so the count changes nothing it counts
/// (a merged page stays unmapped, an untouched page absent).
pub fn host_frames(ranges: &[(usize, usize)]) -> Result<u64, FramesError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|source| FramesError::Read {
        path: "/proc/self/maps",
        source,
    })?;
    let mut all: Vec<(usize, usize)> = ranges.to_vec();
    all.extend(clip_views(&pool_views(&maps), &pool_files()));
    distinct_frames(&all)
}

/// The distinct frames other than the kernel's zero page that `ranges`
/// (of this process) map now, from pagemap alone.
pub fn distinct_frames(ranges: &[(usize, usize)]) -> Result<u64, FramesError> {
    let pm = Pagemap::open()?;
    let zero_pfn = pagefold_dedup::mm::zero_pfn(&pm);
    if zero_pfn == 0 {
        return Err(FramesError::NoFrames);
    }
    let overlap = overlapping(ranges);
    // A frame mapped once (pagemap's "exclusively mapped" bit) counts
    // once as it is; only the others (pool and KSM pages, and a range
    // given twice) need sorting, which under emulation is most of a
    // sample's cost.
    let mut once = 0;
    let mut pfns = Vec::new();
    let mut entries = vec![Entry(0); CHUNK_PAGES];
    for &(start, len) in ranges {
        let npages = len / PAGE_SIZE;
        for done in (0..npages).step_by(CHUNK_PAGES) {
            let n = (npages - done).min(CHUNK_PAGES);
            pm.read(start + done * PAGE_SIZE, &mut entries[..n])?;
            for e in &entries[..n] {
                if !e.present() || e.pfn() == zero_pfn || e.pfn() == 0 {
                    continue;
                }
                if e.0 & PM_MMAP_EXCLUSIVE != 0 && !overlap {
                    once += 1;
                } else {
                    pfns.push(e.pfn());
                }
            }
        }
    }
    Ok(once + distinct(&mut pfns))
}

/// pagemap's bit 56: the page is mapped exactly once.
const PM_MMAP_EXCLUSIVE: u64 = 1 << 56;

/// Whether any two of `ranges` overlap (then a frame mapped once may
/// still be read twice).
fn overlapping(ranges: &[(usize, usize)]) -> bool {
    let mut r = ranges.to_vec();
    r.sort_unstable();
    r.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
}

/// The `Pss:` of `smaps_rollup`'s text, in KiB.
pub fn parse_pss_kib(rollup: &str) -> Option<u64> {
    rollup.lines().find_map(|l| {
        let rest = l.strip_prefix("Pss:")?;
        let mut w = rest.split_whitespace();
        let kib = w.next()?.parse().ok()?;
        (w.next() == Some("kB")).then_some(kib)
    })
}

/// This process's proportional set size, MiB: every frame it maps
/// divided among its mappings (`/proc/self/smaps_rollup`).
pub fn self_pss_mib() -> Result<f64, FramesError> {
    const PATH: &str = "/proc/self/smaps_rollup";
    let text =
        std::fs::read_to_string(PATH).map_err(|source| FramesError::Read { path: PATH, source })?;
    parse_pss_kib(&text)
        .map(|k| k as f64 / 1024.0)
        .ok_or(FramesError::NoPss(PATH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_pools_shared_views_only() {
        let maps = "\
55d0c0000000-55d0c0100000 r-xp 00000000 08:01 123 /usr/bin/pagefold
7f0000000000-7f0040000000 rw-s 00000000 00:01 77 /memfd:pagefold-pool (deleted)
7f1000000000-7f1000001000 rw-p 00003000 00:01 77 /memfd:pagefold-pool (deleted)
7f2000000000-7f2000200000 rw-p 00000000 00:00 0 
7f3000000000-7f3000001000 rw-s 00000000 00:01 78 /memfd:other (deleted)
7f4000000000-7f4000002000 r--s 00000000 00:01 77 /memfd:pagefold-pool (deleted)
";
        let views = pool_views(maps);
        assert_eq!(
            views,
            [
                (0x7f00_0000_0000, 0x4000_0000, 77),
                (0x7f40_0000_0000, 0x2000, 77)
            ]
        );
        assert!(pool_views("").is_empty());
        assert!(pool_views("garbage line\n").is_empty());
        // Cut to the file's 3 pages; a view of a file not open is dropped.
        assert_eq!(
            clip_views(&views, &[(77, 3 * 4096)]),
            [(0x7f00_0000_0000, 0x3000), (0x7f40_0000_0000, 0x2000)]
        );
        assert!(clip_views(&views, &[(78, 4096)]).is_empty());
        assert!(clip_views(&views, &[(77, 0)]).is_empty());
    }

    #[test]
    fn tells_overlapping_ranges() {
        assert!(!overlapping(&[(0x3000, 0x1000), (0x1000, 0x2000)]));
        assert!(overlapping(&[(0x3000, 0x1000), (0x1000, 0x2001)]));
        assert!(overlapping(&[(0x1000, 0x1000), (0x1000, 0x1000)]));
        assert!(!overlapping(&[]));
    }

    #[test]
    fn counts_each_frame_once() {
        let mut v = vec![9, 3, 9, 1, 3, 3];
        assert_eq!(distinct(&mut v), 3);
        assert_eq!(distinct(&mut Vec::new()), 0);
    }

    #[test]
    fn reads_pss_in_kib() {
        let rollup = "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0 [rollup]\n\
                      Rss:             1048576 kB\nPss:              524800 kB\n\
                      Pss_Anon:         500000 kB\n";
        assert_eq!(parse_pss_kib(rollup), Some(524_800));
        assert_eq!(parse_pss_kib("Rss: 1 kB\n"), None);
        assert_eq!(parse_pss_kib("Pss: x kB\n"), None);
    }

    #[test]
    fn a_mapping_counts_once_per_frame_and_the_zero_page_not_at_all() {
        let len = 64 * PAGE_SIZE;
        let p = pagefold_dedup::mm::map_anon(len).unwrap();
        let base = p as usize;
        match distinct_frames(&[(base, len)]) {
            Ok(n) => assert_eq!(n, 0),
            Err(FramesError::NoFrames) => {
                eprintln!("SKIPPED: pagemap shows frames to root only");
                // SAFETY: the mapping made above, used no more.
                unsafe { pagefold_dedup::mm::unmap(p, len) };
                return;
            }
            Err(e) => panic!("{e}"),
        }
        for i in 0..16 {
            // SAFETY: inside the mapping made above: write 16 pages, read
            // 16 more (those map the kernel's zero page).
            unsafe {
                std::ptr::write_volatile((base + i * PAGE_SIZE) as *mut u8, 1);
                std::ptr::read_volatile((base + (16 + i) * PAGE_SIZE) as *const u8);
            }
        }
        assert_eq!(distinct_frames(&[(base, len)]).unwrap(), 16);
        // The same range twice still counts each frame once.
        assert_eq!(distinct_frames(&[(base, len), (base, len)]).unwrap(), 16);
        // SAFETY: the mapping made above, used no more.
        unsafe { pagefold_dedup::mm::unmap(p, len) };
    }
}
