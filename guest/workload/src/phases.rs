//! The memory phases. Each returns its report, or `Err(Stopped)` when the
//! host asked the guest to stop (seen in a PROGRESS/SLEEP status).

use crate::clock::{rdtsc, Clock};
use crate::host;
use crate::store::Store;
use crate::virtio::{BlockDev, DiskError, DEPTH, MAX_REQUEST_BYTES, STATUS_OK};
use pagefold_guest_abi::classes::{
    churn_len, churn_member, page_class, page_content, Content, PageClass,
};
use pagefold_guest_abi::disk::{
    checksum_step, image_page_base, page_digest, CHECKSUM_INIT, SECTORS_PER_PAGE,
};
use pagefold_guest_abi::generator::{
    check_page, fill_page_nt, first_difference, is_zero_page, store_fence, zero_page_nt,
};
use pagefold_guest_abi::mailbox::{PhaseReport, NO_MISMATCH, PROGRESS_PAGES};
use pagefold_guest_abi::{phase, WorkloadParams, PAGE_SIZE};

/// The host asked us to stop.
pub struct Stopped;

/// Why DISK_READ ended early.
pub enum DiskFailure {
    Stopped,
    Disk(DiskError),
}

impl From<Stopped> for DiskFailure {
    fn from(_: Stopped) -> Self {
        Self::Stopped
    }
}

/// DISK_READ gives up when no request completes for this long. The VMM
/// stops a stuck guest anyway; this turns a silent hang into a named error.
const DISK_TIMEOUT_MS: u64 = 10_000;

/// DISK_READ checks the device status (one MMIO exit) when nothing has
/// completed for this long, so a queue the device declared broken fails at
/// once instead of after the timeout.
const DISK_STATUS_CHECK_MS: u64 = 50;

/// Device status bit: the device declared the queue broken.
const S_NEEDS_RESET: u32 = 64;

/// State that lives across phases.
pub struct Workload {
    pub params: WorkloadParams,
    pub store: Store,
    /// Next churn-set rank to rewrite (round-robin, reset by FILL).
    churn_cursor: u64,
    /// Churn writes since the last FILL.
    churn_writes: u64,
}

pub(crate) fn report(phase: u32, slot: usize) -> PhaseReport {
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
    pub(crate) fn write_page(&self, i: u64, version: u32) -> PageClass {
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

    /// DISK_READ: reads the first `arg` pages of disk 0 (0: `disk_pages`)
    /// into the disk area, page `k` to `disk_page_gpa(k)`, with up to
    /// `DEPTH` requests of at most 1 MiB in flight; checksums each page in
    /// disk order and, for a test image, checks it. Pages are checked while
    /// the device reads the next ones.
    pub fn disk_read(&mut self, slot: usize, arg: u64) -> Result<PhaseReport, DiskFailure> {
        let mut r = report(phase::DISK_READ, slot);
        let pages = if arg == 0 {
            self.params.disk_pages
        } else {
            arg
        };
        let base = self.params.disk_mmio[0];
        let mut dev = BlockDev::init(base).map_err(DiskFailure::Disk)?;
        let result = self.read_disk_pages(&mut dev, pages, &mut r);
        dev.ack_interrupts();
        let sectors = dev.sectors();
        dev.reset();
        result?;
        r.bytes = r.pages * PAGE_SIZE;
        crate::log!(
            "disk-read: disk 0 at {:#x} ({} sectors): {} pages, checksum {:#018x}, zero {}, mismatches {}",
            base,
            sectors,
            r.pages,
            r.checksum,
            r.zero_pages,
            r.mismatches
        );
        if r.mismatches > 0 {
            crate::log!(
                "disk-read: first mismatch: page {} word {}: expected {:#018x}, found {:#018x}",
                r.first_mismatch,
                r.mismatch_word,
                r.expected_word,
                r.found_word
            );
        }
        Ok(r)
    }

    fn read_disk_pages(
        &mut self,
        dev: &mut BlockDev,
        pages: u64,
        r: &mut PhaseReport,
    ) -> Result<(), DiskFailure> {
        let needed = pages * SECTORS_PER_PAGE;
        if dev.sectors() < needed {
            return Err(DiskFailure::Disk(DiskError::TooSmall {
                sectors: dev.sectors(),
                needed,
            }));
        }
        let layout = self.store.layout;
        let seed = self.params.disk_seed;
        let max_pages = MAX_REQUEST_BYTES / PAGE_SIZE;
        // Request slots form a FIFO: `head` is the oldest in flight. Pages
        // are checked in disk order, so the checksum does not depend on the
        // order completions arrive in.
        let mut req = [(0u64, 0u64); DEPTH];
        let mut done = [None::<u8>; DEPTH];
        let (mut head, mut inflight) = (0usize, 0usize);
        let mut next = 0u64;
        r.checksum = CHECKSUM_INIT;
        let clock = Clock::start(self.params.tsc_khz);
        let mut last_progress = 0u64;
        let mut spins = 0u32;
        while r.pages < pages {
            let mut submitted = false;
            while inflight < DEPTH && next < pages {
                let n = (pages - next).min(layout.disk_run(next)).min(max_pages);
                let s = (head + inflight) % DEPTH;
                dev.submit_read(
                    s,
                    next * SECTORS_PER_PAGE,
                    layout.disk_page_gpa(next),
                    (n * PAGE_SIZE) as u32,
                );
                req[s] = (next, n);
                done[s] = None;
                next += n;
                inflight += 1;
                submitted = true;
            }
            if submitted {
                dev.notify();
            }
            let mut progressed = false;
            while let Some(c) = dev.poll() {
                done[c.slot] = Some(c.status);
                progressed = true;
            }
            while inflight > 0 {
                let Some(status) = done[head] else { break };
                let (first, n) = req[head];
                if status != STATUS_OK {
                    return Err(DiskFailure::Disk(DiskError::Io {
                        sector: first * SECTORS_PER_PAGE,
                        status,
                    }));
                }
                for k in first..first + n {
                    self.check_disk_page(k, seed, r);
                    tick(phase::DISK_READ, r.pages, pages)?;
                }
                done[head] = None;
                head = (head + 1) % DEPTH;
                inflight -= 1;
            }
            if progressed {
                spins = 0;
                last_progress = clock.elapsed_us();
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                let idle_ms = clock.elapsed_us().saturating_sub(last_progress) / 1000;
                if idle_ms >= DISK_STATUS_CHECK_MS {
                    let status = dev.device_status();
                    if status & S_NEEDS_RESET != 0 {
                        return Err(DiskFailure::Disk(DiskError::DeviceStatus { status }));
                    }
                }
                if idle_ms >= DISK_TIMEOUT_MS {
                    return Err(DiskFailure::Disk(DiskError::Timeout {
                        sector: req[head].0 * SECTORS_PER_PAGE,
                        ms: idle_ms,
                    }));
                }
            }
            core::hint::spin_loop();
        }
        Ok(())
    }

    /// Folds disk-area page `k` into the report: checksum, zero count, and
    /// (test image) the comparison with the generator.
    fn check_disk_page(&self, k: u64, seed: u64, r: &mut PhaseReport) {
        let page = self.store.disk_page(k);
        r.checksum = checksum_step(r.checksum, page_digest(page));
        if is_zero_page(page) {
            r.zero_pages += 1;
        }
        if seed != 0 {
            let base = image_page_base(seed, k);
            if !check_page(page, base) {
                if r.mismatches == 0 {
                    r.first_mismatch = k;
                    if let Some((j, e, f)) = first_difference(page, Some(base)) {
                        r.mismatch_word = j as u64;
                        r.expected_word = e;
                        r.found_word = f;
                    }
                }
                r.mismatches += 1;
            }
        }
        r.pages += 1;
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
