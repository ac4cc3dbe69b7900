//! PROBE_MERGE: the write-timing side channel from inside a guest. The
//! guest writes each probe page once, in random order, and times the write
//! with the TSC; a write that takes a copy-on-write fault (a merged page,
//! or a dropped zero page that must be backed again) is far slower than a
//! write to a page the guest owns. The classification is
//! `pagefold_guest_abi::merge_probe`'s. Right after each write the guest
//! also times a read of another cache line of the page: a copy-on-write
//! copy or a zero page's clearing leaves the page in the cache.

use core::arch::x86_64::{_mm_clflush, _mm_lfence, _mm_mfence, _rdtsc};

use crate::host;
use crate::phases::{report, Stopped, Workload};
use pagefold_guest_abi::classes::{page_class, page_content, Content, PageClass, Region};
use pagefold_guest_abi::generator::page_word;
use pagefold_guest_abi::mailbox::PhaseReport;
use pagefold_guest_abi::merge_probe::{
    evaluate, evaluate_reads, Rng, Sample, MAX_PROBES, READ_WORD,
};
use pagefold_guest_abi::phase;

/// Label bit of an entry of the write order (the rest is the page index).
const SHARED_BIT: u32 = 1 << 31;

/// Evicts `*word`'s cache line from every cache level.
fn flush_line(word: *const u64) {
    // SAFETY: `word` is inside a logical page of the data area (see
    // `timed_write`); CLFLUSH only evicts the line (checked as a read, so
    // it takes no write fault on a write-protected page), and the fence
    // orders it before the timed accesses.
    unsafe {
        _mm_clflush(word.cast::<u8>());
        _mm_mfence();
    }
}

/// Times a read of `*word`, in TSC cycles (fenced like `timed_write`).
fn timed_read(word: *const u64) -> u64 {
    // SAFETY: `word` is inside a logical page of the data area (see
    // `timed_write`); the read has no side effect.
    unsafe {
        _mm_lfence();
        let t0 = _rdtsc();
        _mm_lfence();
        let _ = word.read_volatile();
        _mm_lfence();
        _rdtsc().wrapping_sub(t0)
    }
}

/// Times one write of `value` to `*word`, in TSC cycles: the fences keep
/// the write (and a fault it takes) between the two TSC reads, and drain it
/// from the store buffer before the second.
fn timed_write(word: *mut u64, value: u64) -> u64 {
    // SAFETY: `word` is the first word of a logical page of the data area
    // (identity-mapped guest RAM, 8-aligned; see `Store::page`), and the
    // guest runs one thread. lfence/mfence/rdtsc have no other effects.
    unsafe {
        _mm_lfence();
        let t0 = _rdtsc();
        _mm_lfence();
        word.write_volatile(value);
        _mm_mfence();
        _mm_lfence();
        _rdtsc().wrapping_sub(t0)
    }
}

impl Workload {
    /// The attacker's label of logical page `i`: shared when another VM of
    /// the same seed holds it (the shared region), when it is all zero, or
    /// when it duplicates a page of this VM.
    fn probe_label(&self, i: u64) -> bool {
        match page_class(&self.params, i) {
            (Region::Shared, _) | (_, PageClass::Zero) | (_, PageClass::Dup { .. }) => true,
            (Region::Private, PageClass::Unique) => false,
        }
    }

    /// PROBE_MERGE: sleeps `wait_ms`, writes up to `MAX_PROBES / 2` pages
    /// of each label once in random order and reports the classification.
    pub fn probe_merge(&mut self, slot: usize, wait_ms: u64) -> Result<PhaseReport, Stopped> {
        let mut r = report(phase::PROBE_MERGE, slot);
        if wait_ms > 0 && host::stopped(host::sleep_ms(wait_ms)) {
            return Err(Stopped);
        }
        const HALF: usize = MAX_PROBES / 2;
        let mut shared = [0u32; HALF];
        let mut unique = [0u32; HALF];
        let (mut ns, mut nu) = (0usize, 0usize);
        let total = self.store.layout.pages;
        for i in 0..total {
            if ns == HALF && nu == HALF {
                break;
            }
            if self.probe_label(i) {
                if ns < HALF {
                    shared[ns] = i as u32;
                    ns += 1;
                }
            } else if nu < HALF {
                unique[nu] = i as u32;
                nu += 1;
            }
        }
        let k = ns.min(nu);
        let n = 2 * k;
        let mut order = [0u32; MAX_PROBES];
        for j in 0..k {
            order[2 * j] = shared[j] | SHARED_BIT;
            order[2 * j + 1] = unique[j];
        }
        let mut rng = Rng::new(
            self.params.private_seed ^ self.params.vm_index.rotate_left(32) ^ 0x7072_6f62_65,
        );
        rng.shuffle(&mut order[..n]);
        let mut samples = [Sample::default(); MAX_PROBES];
        let mut reads = [Sample::default(); MAX_PROBES];
        for ((s, rd), &o) in samples.iter_mut().zip(reads.iter_mut()).zip(&order[..n]) {
            let i = u64::from(o & !SHARED_BIT);
            // The page's own first word: its content stays as it is.
            let value = match page_content(&self.params, i, self.store.version(i)) {
                Content::Zero => 0,
                Content::Pattern(base) => page_word(base, 0),
            };
            let page = self.store.page(i);
            let shared = o & SHARED_BIT != 0;
            // The line the read below times leaves the cache first: a
            // merger that keeps reading pages (ksmd without sleep) would
            // otherwise leave unmerged pages' lines cached too, and the
            // read would tell nothing. After this only a copy or a clear
            // of the page by the write brings the line back.
            flush_line(&page[READ_WORD]);
            *s = Sample {
                cycles: timed_write(page.as_mut_ptr(), value),
                shared,
            };
            // Then another cache line of the page: in the cache if the
            // kernel just copied or cleared the page for the write.
            *rd = Sample {
                cycles: timed_read(&page[READ_WORD]),
                shared,
            };
        }
        let mut scratch = [0u64; MAX_PROBES];
        // Relative to the local baseline: the host's speed drifts during the
        // probe (other work on its CPUs) by as much as the gap between the
        // labels, where a COW fault and a dirty-log fault differ by 1 us.
        r.probe = evaluate(&mut samples[..n], &mut scratch[..n], self.params.tsc_khz, true);
        evaluate_reads(&mut reads[..n], &mut scratch[..n], &mut r.probe);
        r.pages = n as u64;
        Ok(r)
    }
}
