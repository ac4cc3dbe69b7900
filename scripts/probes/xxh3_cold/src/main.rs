//! See Cargo.toml: the cost of the engine's page hash on cold memory.

use std::time::Instant;
use twox_hash::XxHash3_64;

const PAGE: usize = 4096;
const PAGES: usize = 76_800;

fn main() {
    // 300 MiB of 0x01, as `bench ksm-seed --shape full` fills its region.
    let mem = vec![1u8; PAGES * PAGE];
    let gbps = |secs: f64| (PAGES * PAGE) as f64 / secs / 1e9;
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..PAGES {
        acc ^= XxHash3_64::oneshot(std::hint::black_box(&mem[..PAGE]));
    }
    let d = t.elapsed().as_secs_f64();
    println!(
        "hot page x {PAGES}: {:.1} ms ({:.1} GB/s)",
        d * 1e3,
        gbps(d)
    );
    for round in 0..6 {
        let prefetch = round % 2 == 1;
        let t = Instant::now();
        for i in 0..PAGES {
            if prefetch && i + 1 < PAGES {
                for line in (0..PAGE).step_by(64) {
                    let p = mem[(i + 1) * PAGE + line..].as_ptr();
                    // SAFETY: a prefetch hint on an address inside `mem`;
                    // it reads nothing and cannot fault.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch(
                            p as *const i8,
                            std::arch::x86_64::_MM_HINT_T0,
                        )
                    };
                }
            }
            acc ^= XxHash3_64::oneshot(&mem[i * PAGE..(i + 1) * PAGE]);
        }
        let d = t.elapsed().as_secs_f64();
        println!(
            "cold pages, prefetch of the next page {prefetch}: {:.1} ms ({:.1} GB/s)",
            d * 1e3,
            gbps(d)
        );
    }
    std::hint::black_box(acc);
}
