//! LATENCY and LATENCY_WRITE: the pause probe. The vCPU spins on the TSC;
//! a gap between two consecutive reads above `GAP_THRESHOLD_NS` is time
//! the guest did not run (a VM exit, a park by the dedup engine, a host
//! preemption, a COW fault), recorded into the shared histogram.

use crate::clock::rdtsc;
use crate::host;
use crate::log;
use crate::phases::{Stopped, Workload};
use pagefold_guest_abi::generator::store_fence;
use pagefold_guest_abi::mailbox::{PhaseReport, NO_MISMATCH};
use pagefold_guest_abi::pause::{PauseHistogram, GAP_THRESHOLD_NS, WRITE_INTERVAL_US};
use pagefold_guest_abi::{phase, PAGE_SIZE};

/// The probe checks in with the host (PROGRESS, which carries a stop) this
/// often. The exit's own time is left out of the figures.
const CHECK_IN_MS: u64 = 500;

/// TSC cycles of `ns` nanoseconds at `khz`.
fn cycles(ns: u64, khz: u64) -> u64 {
    ((u128::from(ns) * u128::from(khz)) / 1_000_000) as u64
}

/// Nanoseconds of `c` TSC cycles at `khz`.
fn nanos(c: u64, khz: u64) -> u64 {
    ((u128::from(c) * 1_000_000) / u128::from(khz)) as u64
}

impl Workload {
    /// Runs the probe for `ms` milliseconds, rewriting one shared page per
    /// `WRITE_INTERVAL_US` if `writes`. Fills `hist` and returns the report.
    pub fn latency(
        &mut self,
        slot: usize,
        ms: u64,
        writes: bool,
        hist: &mut PauseHistogram,
    ) -> Result<PhaseReport, Stopped> {
        let op = if writes {
            phase::LATENCY_WRITE
        } else {
            phase::LATENCY
        };
        let mut r = PhaseReport {
            phase: op,
            slot: slot as u32,
            first_mismatch: NO_MISMATCH,
            ..PhaseReport::default()
        };
        let khz = self.params.tsc_khz;
        if khz == 0 {
            log!("latency: no TSC rate from the host; the probe cannot time gaps");
            return Ok(r);
        }
        let threshold = cycles(GAP_THRESHOLD_NS, khz);
        let write_every = cycles(WRITE_INTERVAL_US * 1000, khz);
        let check_every = CHECK_IN_MS * khz;
        let budget = ms.saturating_mul(khz);
        let mut cursor = 0u64;
        let mut prev = rdtsc();
        let mut next_write = prev.wrapping_add(write_every);
        let mut next_check = prev.wrapping_add(check_every);
        let mut run = 0u64;
        loop {
            let now = rdtsc();
            let gap = now.wrapping_sub(prev);
            run += gap;
            if gap > threshold {
                let ns = nanos(gap, khz);
                hist.record_ns(ns);
                r.pauses.gaps += 1;
                r.pauses.stopped_ns += ns;
                r.pauses.max_gap_ns = r.pauses.max_gap_ns.max(ns);
            }
            if run >= budget {
                break;
            }
            if writes && now.wrapping_sub(next_write) < u64::MAX / 2 {
                // The write lands before the next read: its time, a COW
                // fault included, is part of the next gap.
                self.rewrite_shared(&mut cursor);
                r.pages += 1;
                next_write = next_write.wrapping_add(write_every);
            }
            if now.wrapping_sub(next_check) < u64::MAX / 2 {
                if host::stopped(host::progress(op, run / khz, ms)) {
                    return Err(Stopped);
                }
                next_check = next_check.wrapping_add(check_every);
                // Leave the check-in's exit out: restart from here.
                prev = rdtsc();
                continue;
            }
            prev = now;
        }
        r.pauses.run_ns = nanos(run, khz);
        r.bytes = r.pages * PAGE_SIZE;
        Ok(r)
    }

    /// Rewrites shared page `*cursor` with its current content, then moves
    /// the cursor on (wrapping over the shared set).
    fn rewrite_shared(&mut self, cursor: &mut u64) {
        let shared = self.params.shared_pages;
        if shared == 0 {
            return;
        }
        let i = *cursor % shared;
        let v = self.store.version(i).max(1);
        self.write_page(i, v);
        store_fence();
        *cursor = (i + 1) % shared;
    }
}
