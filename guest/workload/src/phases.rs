//! The memory phases. Each returns its report, or `Err(Stopped)` when the
//! host asked the guest to stop (seen in a PROGRESS/SLEEP status).

use crate::clock::{rdtsc, Clock};
use crate::host;
use crate::store::Store;
use pagefold_guest_abi::classes::{
    churn_len, churn_member, page_class, page_content, Content, PageClass,
};
use pagefold_guest_abi::generator::{
    check_page, fill_page_nt, first_difference, is_zero_page, store_fence, zero_page_nt,
};
use pagefold_guest_abi::mailbox::{PhaseReport, NO_MISMATCH, PROGRESS_PAGES};
use pagefold_guest_abi::{phase, WorkloadParams, PAGE_SIZE};

/// The host asked us to stop.
pub struct Stopped;

/// State that lives across phases.
pub struct Workload {
    pub params: WorkloadParams,
    pub store: Store,
    /// Next churn-set rank to rewrite (round-robin, reset by FILL).
    churn_cursor: u64,
    /// Churn writes since the last FILL.
    churn_writes: u64,
}

fn report(phase: u32, slot: usize) -> PhaseReport {
    PhaseReport {
        phase,
        slot: slot as u32,
        first_mismatch: NO_MISMATCH,
        ..PhaseReport::default()
    }
}

/// Sends PROGRESS every PROGRESS_PAGES pages; Err if the host said stop.
fn tick(phase: u32, done: u64, total: u64) -> Result<(), Stopped> {
    if done % PROGRESS_PAGES == 0 && done != 0 {
        store_fence();
        if host::stopped(host::progress(phase, done, total)) {
            return Err(Stopped);
        }
    }
    Ok(())
}

impl Workload {
    pub fn new(params: WorkloadParams, store: Store) -> Self {
        Self {
            params,
            store,
            churn_cursor: 0,
            churn_writes: 0,
        }
    }

    /// Writes page `i` at `version`; returns its class.
    fn write_page(&self, i: u64, version: u32) -> PageClass {
        let page = self.store.page(i);
        match page_content(&self.params, i, version) {
            Content::Zero => zero_page_nt(page),
            Content::Pattern(base) => fill_page_nt(page, base),
        }
        self.store.set_version(i, version);
        page_class(&self.params, i).1
    }

    fn count(r: &mut PhaseReport, class: PageClass) {
        r.pages += 1;
        match class {
            PageClass::Zero => r.zero_pages += 1,
            PageClass::Dup { .. } => r.dup_pages += 1,
            PageClass::Unique => {}
        }
    }

    /// FILL: every page at version 1; resets churn.
    pub fn fill(&mut self, slot: usize) -> Result<PhaseReport, Stopped> {
        let mut r = report(phase::FILL, slot);
        let total = self.store.layout.pages;
        for i in 0..total {
            let c = self.write_page(i, 1);
            Self::count(&mut r, c);
            tick(phase::FILL, i + 1, total)?;
        }
        store_fence();
        self.churn_cursor = 0;
        self.churn_writes = 0;
        r.bytes = r.pages * PAGE_SIZE;
        Ok(r)
    }

    /// REWRITE: every page again with its current version (a page never
    /// written gets version 1).
    pub fn rewrite(&mut self, slot: usize) -> Result<PhaseReport, Stopped> {
        let mut r = report(phase::REWRITE, slot);
        let total = self.store.layout.pages;
        for i in 0..total {
            let v = self.store.version(i).max(1);
            let c = self.write_page(i, v);
            Self::count(&mut r, c);
            tick(phase::REWRITE, i + 1, total)?;
        }
        store_fence();
        r.bytes = r.pages * PAGE_SIZE;
        Ok(r)
    }

    /// VERIFY: regenerate and compare every page.
    pub fn verify(&mut self, slot: usize) -> Result<PhaseReport, Stopped> {
        let mut r = report(phase::VERIFY, slot);
        let total = self.store.layout.pages;
        for i in 0..total {
            let page = self.store.page(i);
            let v = self.store.version(i);
            let content = page_content(&self.params, i, v);
            let (ok, base) = match content {
                Content::Zero => (is_zero_page(page), None),
                Content::Pattern(b) => (check_page(page, b), Some(b)),
            };
            if !ok {
                if r.mismatches == 0 {
                    r.first_mismatch = i;
                    if let Some((j, e, f)) = first_difference(page, base) {
                        r.mismatch_word = j as u64;
                        r.expected_word = e;
                        r.found_word = f;
                    }
                }
                r.mismatches += 1;
            }
            if content == Content::Zero {
                r.zero_pages += 1;
            } else if let PageClass::Dup { .. } = page_class(&self.params, i).1 {
                r.dup_pages += 1;
            }
            r.pages += 1;
            tick(phase::VERIFY, i + 1, total)?;
        }
        r.bytes = r.pages * PAGE_SIZE;
        Ok(r)
    }

    /// CHURN: rewrite churn-set pages round-robin with a new version each,
    /// at `churn_rate` pages/s (0: flat out) for `duration_ms`.
    pub fn churn(&mut self, slot: usize, duration_ms: u64) -> Result<PhaseReport, Stopped> {
        let mut r = report(phase::CHURN, slot);
        let len = churn_len(&self.params);
        let rate = u64::from(self.params.churn_rate);
        let clock = Clock::start(self.params.tsc_khz);
        let limit_us = duration_ms.saturating_mul(1000);
        loop {
            let now = clock.elapsed_us();
            if now >= limit_us {
                break;
            }
            let batch = if len == 0 {
                0
            } else if rate == 0 {
                256
            } else {
                let due = ((u128::from(rate) * u128::from(now)) / 1_000_000) as u64 + 1;
                due.saturating_sub(r.pages).min(256)
            };
            if batch == 0 {
                // Ahead of schedule (or nothing to churn): idle in the host.
                let left_ms = (limit_us - now).div_ceil(1000);
                let ms = if len == 0 { left_ms } else { 1 };
                if host::stopped(host::sleep_ms(ms.min(left_ms))) {
                    return Err(Stopped);
                }
                continue;
            }
            for _ in 0..batch {
                let i = churn_member(&self.params, self.churn_cursor);
                let v = self.store.version(i).wrapping_add(1);
                let c = self.write_page(i, v);
                Self::count(&mut r, c);
                self.churn_cursor = (self.churn_cursor + 1) % len;
                self.churn_writes += 1;
                tick(phase::CHURN, r.pages, 0)?;
            }
        }
        store_fence();
        r.bytes = r.pages * PAGE_SIZE;
        r.churn_writes_total = self.churn_writes;
        Ok(r)
    }
}

/// Guest-measured cycles of a phase.
pub fn cycles_since(start: u64) -> u64 {
    rdtsc().wrapping_sub(start)
}
