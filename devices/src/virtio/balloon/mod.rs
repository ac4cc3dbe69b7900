//! virtio-balloon (virtio 1.x, 5.5): the host asks the guest for memory
//! back (inflate), lets it have memory again (deflate), reads its memory
//! statistics, and takes the ranges the guest's free page reporting
//! reports (`VIRTIO_BALLOON_F_REPORTING`).
//!
//! Inflated pages and reported ranges go to a [`DiscardHook`] before the
//! chain is returned to the driver: the guest does not reuse a reported
//! page until then, and the VMM's hook gives the memory back to the host
//! (through the dedup backend when one tracks the guest's RAM). Deflated
//! pages need nothing: the guest's next touch of such a page maps fresh
//! memory (MUST_TELL_HOST is not offered).
//!
//! Queues, in the order the driver numbers them (a queue whose feature is
//! not acked takes no number, so the reporting queue is queue 2 without
//! statistics): inflate, deflate, statistics (STATS_VQ), reporting
//! (REPORTING). FREE_PAGE_HINT and PAGE_POISON are not offered.
//! virtio-bindings has no balloon module, so the constants are the spec's.

pub mod pages;
pub mod stats;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::GuestMemoryMmap;
use virtio_queue::{Queue, QueueOwnedT, QueueT};

pub use stats::GuestStats;

use super::{VirtioDevice, VIRTIO_F_VERSION_1};

/// The virtio device ID of a memory balloon.
pub const VIRTIO_ID_BALLOON: u32 = 5;
/// The statistics queue exists.
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
/// The guest deflates the balloon when it runs out of memory.
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;
/// The reporting queue exists: free page reporting.
pub const VIRTIO_BALLOON_F_REPORTING: u32 = 5;
/// Balloon page frame numbers are of 4 KiB pages, whatever the guest's
/// page size.
pub const PFN_SHIFT: u32 = 12;
/// The page a PFN names.
pub const BALLOON_PAGE: u64 = 1 << PFN_SHIFT;
/// Size of each queue (Linux puts 256 PFNs in one inflate buffer and up
/// to 32 ranges in one report).
pub const QUEUE_SIZE: u16 = 256;

/// A free page report whose give-back takes this long is logged.
const SLOW_REPORT: std::time::Duration = std::time::Duration::from_millis(100);

/// Config space: `num_pages` (le32, the host's target), `actual` (le32,
/// written by the driver), `free_page_hint_cmd_id` and `poison_val`
/// (unused: their features are not offered, they read zero).
const CONFIG_LEN: usize = 16;
/// Offset of `actual`, the one field the driver writes.
const ACTUAL_OFFSET: u64 = 4;

/// What a queue does, by the driver's numbering of the acked features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Inflate,
    Deflate,
    Stats,
    Reporting,
}

/// Gives guest-physical ranges `(address, length)` back to the host;
/// returns the 4 KiB pages given back. Ranges are page aligned, inside
/// guest RAM, and sorted; adjacent ones are merged.
pub type DiscardHook = Arc<dyn Fn(&[(u64, u64)]) -> u64 + Send + Sync>;

/// Which optional features the device offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// The statistics queue.
    pub stats: bool,
    /// The guest may deflate on out-of-memory.
    pub deflate_on_oom: bool,
    /// Free page reporting.
    pub free_page_reporting: bool,
}

/// What the device counted since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// PFNs the guest inflated (valid ones).
    pub inflated_pages: u64,
    /// PFNs the guest deflated (valid ones).
    pub deflated_pages: u64,
    /// 4 KiB pages in the ranges the guest reported free.
    pub reported_pages: u64,
    /// Pages the hook gave back to the host (inflated and reported).
    pub returned_pages: u64,
    /// Reports handled.
    pub reports: u64,
    /// Statistics buffers read.
    pub stats_updates: u64,
    /// Chains of the wrong shape (a writable inflate or deflate buffer, a
    /// length not a multiple of a PFN's or a statistic's, too long, not in
    /// guest memory): returned untouched.
    pub bad_chains: u64,
    /// PFNs or reported ranges outside guest RAM or not page aligned:
    /// skipped.
    pub bad_ranges: u64,
}

/// What the device and the VMM share: the target, the guest's answer,
/// its statistics and the counters.
#[derive(Debug, Default)]
pub struct BalloonState {
    target_pages: AtomicU32,
    actual_pages: AtomicU32,
    stats_wanted: AtomicBool,
    stats: Mutex<Option<GuestStats>>,
    counters: Mutex<Counters>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BalloonState {
    /// The balloon size the host asks for, in 4 KiB pages (`num_pages`).
    pub fn target_pages(&self) -> u32 {
        self.target_pages.load(Ordering::Acquire)
    }

    /// Sets the target; the VMM then raises the configuration-change
    /// interrupt (`MmioTransport::notify_config_change`).
    pub fn set_target_pages(&self, pages: u32) {
        self.target_pages.store(pages, Ordering::Release);
    }

    /// The balloon size the guest says it has reached (`actual`).
    pub fn actual_pages(&self) -> u32 {
        self.actual_pages.load(Ordering::Acquire)
    }

    /// The guest's statistics as last read (None before its first buffer).
    pub fn stats(&self) -> Option<GuestStats> {
        lock(&self.stats).clone()
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        *lock(&self.counters)
    }

    /// Asks for fresh statistics: the held statistics buffer goes back to
    /// the driver at the statistics queue's next processing, which the
    /// VMM triggers (`MmioTransport::notify_queue`).
    pub fn want_stats(&self) {
        self.stats_wanted.store(true, Ordering::Release);
    }
}

/// A virtio-balloon device model.
pub struct Balloon {
    state: Arc<BalloonState>,
    hook: DiscardHook,
    features: Features,
    queue_sizes: Vec<u16>,
    acked_features: u64,
    /// The statistics buffer the driver posted, held until fresh
    /// statistics are wanted.
    stats_head: Option<u16>,
}

impl Balloon {
    /// A balloon offering `features`, giving pages back through `hook`.
    pub fn new(features: Features, hook: DiscardHook) -> Self {
        let n = 2 + usize::from(features.stats) + usize::from(features.free_page_reporting);
        Self {
            state: Arc::default(),
            hook,
            features,
            queue_sizes: vec![QUEUE_SIZE; n],
            acked_features: 0,
            stats_head: None,
        }
    }

    /// The state the VMM keeps to set the target and read the figures.
    pub fn state(&self) -> Arc<BalloonState> {
        self.state.clone()
    }

    /// Features the driver acknowledged at activation.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// The role of the queue the driver numbers `index`, for the features
    /// `acked`: the statistics queue is there only with STATS_VQ, and the
    /// reporting queue takes the next number.
    pub fn role(acked: u64, index: usize) -> Option<Role> {
        let has = |f: u32| acked & (1 << f) != 0;
        let mut roles = vec![Role::Inflate, Role::Deflate];
        if has(VIRTIO_BALLOON_F_STATS_VQ) {
            roles.push(Role::Stats);
        }
        if has(VIRTIO_BALLOON_F_REPORTING) {
            roles.push(Role::Reporting);
        }
        roles.get(index).copied()
    }

    /// The queue number of the statistics queue once the driver acked it.
    pub fn stats_queue(acked: u64) -> Option<usize> {
        (acked & (1 << VIRTIO_BALLOON_F_STATS_VQ) != 0).then_some(2)
    }

    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..4].copy_from_slice(&self.state.target_pages().to_le_bytes());
        c[4..8].copy_from_slice(&self.state.actual_pages().to_le_bytes());
        c
    }

    /// Inflate or deflate: every chain's PFNs are counted, and inflated
    /// ones given back before the chain is returned.
    fn process_pfns(
        &mut self,
        index: usize,
        inflate: bool,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, super::Error> {
        let (state, hook) = (&self.state, &self.hook);
        super::process_chains(index, queue, mem, |chain| {
            let parsed = pages::pfn_ranges(chain, mem);
            let mut c = lock(&state.counters);
            match parsed {
                Ok(p) => {
                    c.bad_ranges += p.bad;
                    if inflate {
                        c.inflated_pages += p.pages;
                        drop(c);
                        if !p.ranges.is_empty() {
                            let back = hook(&p.ranges);
                            lock(&state.counters).returned_pages += back;
                        }
                    } else {
                        c.deflated_pages += p.pages;
                    }
                }
                Err(e) => {
                    log::debug!("virtio-balloon: queue {index}: {e}");
                    c.bad_chains += 1;
                }
            }
            0
        })
    }

    /// Free page reporting: each chain's ranges are given back before it
    /// is returned, so the guest reuses none of them before.
    fn process_report(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, super::Error> {
        let (state, hook) = (&self.state, &self.hook);
        super::process_chains(index, queue, mem, |chain| {
            let parsed = pages::reported_ranges(chain, mem);
            let mut c = lock(&state.counters);
            match parsed {
                Ok(p) => {
                    c.reports += 1;
                    c.bad_ranges += p.bad;
                    c.reported_pages += p.pages;
                    drop(c);
                    if !p.ranges.is_empty() {
                        let t = std::time::Instant::now();
                        let back = hook(&p.ranges);
                        lock(&state.counters).returned_pages += back;
                        // The guest reports nothing more until this chain
                        // is back: a slow give-back holds up every later
                        // report.
                        if t.elapsed() >= SLOW_REPORT {
                            log::info!(
                                "virtio-balloon: a report of {} pages took {:?} to give back ({back} returned)",
                                p.pages,
                                t.elapsed()
                            );
                        }
                    }
                }
                Err(e) => {
                    log::debug!("virtio-balloon: queue {index}: {e}");
                    c.bad_chains += 1;
                }
            }
            0
        })
    }

    /// Statistics: a new buffer is read and held; a held buffer goes back
    /// when fresh statistics are wanted (the driver then fills and posts
    /// it again).
    fn process_stats(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, super::Error> {
        let broken = |e| super::Error::BrokenQueue(index, e);
        let mut used = false;
        while let Some(chain) = queue.iter(mem).map_err(broken)?.next() {
            let head = chain.head_index();
            match stats::read(chain, mem) {
                Ok(s) => {
                    *lock(&self.state.stats) = Some(s);
                    lock(&self.state.counters).stats_updates += 1;
                }
                Err(e) => {
                    log::debug!("virtio-balloon: statistics: {e}");
                    lock(&self.state.counters).bad_chains += 1;
                }
            }
            // A driver posts one buffer at a time; an earlier one still
            // held goes back now rather than being lost.
            if let Some(old) = self.stats_head.replace(head) {
                queue.add_used(mem, old, 0).map_err(broken)?;
                used = true;
            }
        }
        if self.state.stats_wanted.swap(false, Ordering::AcqRel) {
            if let Some(h) = self.stats_head.take() {
                queue.add_used(mem, h, 0).map_err(broken)?;
                used = true;
            }
        }
        if !used {
            return Ok(false);
        }
        queue.needs_notification(mem).map_err(broken)
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn avail_features(&self) -> u64 {
        let mut f = 1u64 << VIRTIO_F_VERSION_1;
        if self.features.stats {
            f |= 1 << VIRTIO_BALLOON_F_STATS_VQ;
        }
        if self.features.deflate_on_oom {
            f |= 1 << VIRTIO_BALLOON_F_DEFLATE_ON_OOM;
        }
        if self.features.free_page_reporting {
            f |= 1 << VIRTIO_BALLOON_F_REPORTING;
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.config(), offset, data);
    }

    /// Only `actual` is the driver's to write, as one 32-bit store.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        match (offset, <[u8; 4]>::try_from(data)) {
            (ACTUAL_OFFSET, Ok(b)) => self
                .state
                .actual_pages
                .store(u32::from_le_bytes(b), Ordering::Release),
            _ => log::debug!(
                "virtio-balloon: ignored {}-byte config write at {offset:#x}",
                data.len()
            ),
        }
    }

    fn queues_in_use(&self, acked_features: u64) -> usize {
        (0..self.queue_sizes.len())
            .take_while(|&i| Self::role(acked_features, i).is_some())
            .count()
    }

    fn activate(
        &mut self,
        acked_features: u64,
        _queues: &mut [Queue],
        _mem: &GuestMemoryMmap,
    ) -> Result<(), super::Error> {
        self.acked_features = acked_features;
        Ok(())
    }

    fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, super::Error> {
        match Self::role(self.acked_features, index) {
            Some(Role::Inflate) => self.process_pfns(index, true, queue, mem),
            Some(Role::Deflate) => self.process_pfns(index, false, queue, mem),
            Some(Role::Stats) => self.process_stats(index, queue, mem),
            Some(Role::Reporting) => self.process_report(index, queue, mem),
            None => Ok(false),
        }
    }

    /// The driver starts over: the held statistics buffer is its no more
    /// (the queue is reset with it), and `actual` is what it will say.
    fn reset(&mut self) {
        self.acked_features = 0;
        self.stats_head = None;
        self.state.actual_pages.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
