//! The userfaultfd handler thread. It never takes the engine's core lock and
//! never waits for the merging thread (docs/merge-races.md §7): for a write
//! fault on a
//! page that is part of a merge in flight it does nothing, because the merger
//! always unprotects or wakes that range when the merge ends; for any other
//! write-protect fault (a leftover that must not exist, handled anyway) it
//! unprotects the page so the write lands.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::uffd::{Uffd, UffdMsg, EVENT_PAGEFAULT, PAGEFAULT_FLAG_WP};
use crate::PAGE_SIZE;

/// Errors of the fault handler setup.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("eventfd: {0}")]
    EventFd(#[source] std::io::Error),
}

/// Ranges under protection right now, and the registered regions. Shared by
/// the merger and the handler; held only around single ioctls.
#[derive(Debug, Default)]
pub struct ProtState {
    /// Merges and unmerges in flight.
    pub busy: Vec<BusyRange>,
    /// `(start, end)` of registered regions.
    pub regions: Vec<(usize, usize)>,
    /// Faults the handler left to the merger because their page was busy.
    /// A merge that saw this count unchanged from its protect to its end
    /// has no writer of its own to wake: any later message for its range
    /// finds the range no longer busy, and the handler wakes that writer.
    pub deferred: u64,
    /// When the handler deferred the oldest fault that still waits for its
    /// merge to end (`None`: no writer waits).
    pub waiting_since: Option<Instant>,
    /// How long writers waited for merges in flight.
    pub waits: WriteWaits,
}

/// Guest (or device) writes that waited for a merge in flight, from the
/// handler's deferral of the first one to the wake of its range. A vCPU
/// waiting so takes no interrupt: this is a stop of the guest the engine
/// causes, as a park is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteWaits {
    /// Ranges whose wake freed at least one waiting writer.
    pub count: u64,
    /// Their waits in all, microseconds.
    pub total_us: u64,
    /// The longest, microseconds.
    pub max_us: u64,
}

impl WriteWaits {
    fn add(&mut self, waited: std::time::Duration) {
        let us = waited.as_micros().min(u128::from(u64::MAX)) as u64;
        self.count += 1;
        self.total_us = self.total_us.saturating_add(us);
        self.max_us = self.max_us.max(us);
    }
}

/// A range write-protected for a merge window or an unmerge chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyRange {
    pub start: usize,
    pub end: usize,
    /// Bit i: page i of the range is one the merge changes. `None`: every
    /// page is (an unmerge). The others are the window's gaps, protected
    /// only so that one ioctl covers the window.
    pub ops: Option<OpMask>,
}

/// One bit per page of a merge window (`crate::merge::Mask` is this type).
pub type OpMask = u128;

impl BusyRange {
    fn contains(&self, a: usize) -> bool {
        a >= self.start && a < self.end
    }

    /// `a` (in the range) is a gap page: nothing in flight changes it.
    fn is_gap(&self, a: usize) -> bool {
        let i = (a - self.start) / PAGE_SIZE;
        self.ops
            .is_some_and(|m| i >= OpMask::BITS as usize || m & (1 << i) == 0)
    }
}

/// What the busy ranges are doing to a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    /// No merge or unmerge covers it.
    No,
    /// It lies only in merge windows' gaps.
    Gap,
    /// A merge or unmerge in flight changes it.
    Op,
}

impl ProtState {
    fn in_flight(&self, a: usize) -> InFlight {
        let mut found = InFlight::No;
        for r in self.busy.iter().filter(|r| r.contains(a)) {
            if !r.is_gap(a) {
                return InFlight::Op;
            }
            found = InFlight::Gap;
        }
        found
    }
    fn region_contains(&self, a: usize) -> bool {
        self.regions.iter().any(|&(s, e)| a >= s && a < e)
    }

    /// The merger woke a range with deferred writers: their wait ends.
    /// With merges in flight one at a time, the oldest deferral is the
    /// first of this range's.
    pub fn woke(&mut self) {
        if let Some(t) = self.waiting_since.take() {
            self.waits.add(t.elapsed());
        }
    }
}

/// Counters of the handler.
#[derive(Debug, Default)]
pub struct FaultCounters {
    /// Write faults that hit a page under merge (resolved by the merger).
    pub in_merge: AtomicU64,
    /// Stray write-protect faults: the page was still write-protected with
    /// no merge in flight (protection left behind); resolved by unprotecting.
    pub stray: AtomicU64,
    /// Fault messages read after the merge they hit had finished and woken
    /// the writer (the page is no longer protected): nothing to do.
    pub late: AtomicU64,
    /// Write faults on a gap page of a merge window: released at once.
    pub in_gap: AtomicU64,
}

/// A stop signal for the handler thread (an eventfd it polls).
#[derive(Debug)]
pub struct StopFd(OwnedFd);

impl StopFd {
    pub fn new() -> Result<Self, FaultError> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(FaultError::EventFd(std::io::Error::last_os_error()));
        }
        // SAFETY: fd is new and ours.
        Ok(StopFd(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    /// Signals the handler to exit.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}

/// Runs the handler until `stop` is signalled.
pub fn run(
    uffd: Arc<Uffd>,
    prot: Arc<Mutex<ProtState>>,
    stop: Arc<StopFd>,
    counters: Arc<FaultCounters>,
) {
    let mut msgs = [UffdMsg::default(); 16];
    // Tells a late message (the merger already unprotected and woke the
    // page) from protection really left behind.
    let pagemap = crate::pagemap::Pagemap::open().ok();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: uffd.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of 2 pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            return;
        }
        let n = match uffd.read_msgs(&mut msgs) {
            Ok(n) => n,
            Err(e) => {
                log::error!("userfaultfd read failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        };
        for m in &msgs[..n] {
            if m.event != EVENT_PAGEFAULT || m.flags & PAGEFAULT_FLAG_WP == 0 {
                continue;
            }
            let page = m.address as usize & !(PAGE_SIZE - 1);
            let mut p = prot.lock().unwrap_or_else(|e| e.into_inner());
            let busy = p.in_flight(page);
            // A gap page of a merge window: the merge changes nothing
            // there, so the write may land now rather than wait for the
            // window (docs/merge-races.md §6). Should the unprotect fail,
            // the merger releases it with the window, as any other.
            if busy == InFlight::Gap && uffd.unprotect(page, PAGE_SIZE).is_ok() {
                counters.in_gap.fetch_add(1, Ordering::Relaxed);
            } else if busy != InFlight::No {
                // The merger wakes this range when it is done
                // (docs/merge-races.md §6).
                p.deferred += 1;
                p.waiting_since.get_or_insert_with(Instant::now);
                counters.in_merge.fetch_add(1, Ordering::Relaxed);
            } else if p.region_contains(page) {
                let still_protected = pagemap
                    .as_ref()
                    .and_then(|pm| pm.entry(page).ok())
                    .is_none_or(|e| e.uffd_wp());
                if still_protected {
                    counters.stray.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = uffd.unprotect(page, PAGE_SIZE) {
                        log::debug!("stray fault unprotect: {e}");
                        let _ = uffd.wake(page, PAGE_SIZE);
                    }
                } else {
                    counters.late.fetch_add(1, Ordering::Relaxed);
                    let _ = uffd.wake(page, PAGE_SIZE);
                }
            } else {
                let _ = uffd.wake(page, PAGE_SIZE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: usize = 0x10_0000;

    fn page(i: usize) -> usize {
        BASE + i * PAGE_SIZE
    }

    #[test]
    fn a_window_holds_its_ops_and_lets_its_gaps_go() {
        let mut p = ProtState::default();
        p.busy.push(BusyRange {
            start: page(0),
            end: page(8),
            ops: Some(0b1000_0101),
        });
        let kinds: Vec<InFlight> = (0..9).map(|i| p.in_flight(page(i))).collect();
        use InFlight::*;
        assert_eq!(kinds, [Op, Gap, Op, Gap, Gap, Gap, Gap, Op, No]);
        // Within a page, too.
        assert_eq!(p.in_flight(page(1) + 100), Gap);
        assert_eq!(p.in_flight(page(0) - 1), No);
    }

    #[test]
    fn an_unmerge_holds_every_page_and_any_op_wins() {
        let mut p = ProtState::default();
        p.busy.push(BusyRange {
            start: page(0),
            end: page(300),
            ops: None,
        });
        assert_eq!(p.in_flight(page(299)), InFlight::Op);
        // A gap of one range that another range changes is held.
        let mut q = ProtState::default();
        q.busy.push(BusyRange {
            start: page(0),
            end: page(4),
            ops: Some(0b0001),
        });
        q.busy.push(BusyRange {
            start: page(2),
            end: page(6),
            ops: Some(0b0001),
        });
        assert_eq!(q.in_flight(page(1)), InFlight::Gap);
        assert_eq!(q.in_flight(page(2)), InFlight::Op);
        assert_eq!(q.in_flight(page(3)), InFlight::Gap);
    }

    #[test]
    fn waits_add_up_and_keep_the_longest() {
        let mut p = ProtState::default();
        p.woke();
        assert_eq!(p.waits, WriteWaits::default(), "no writer waited");
        p.waiting_since = Some(Instant::now() - std::time::Duration::from_millis(3));
        p.woke();
        p.waiting_since = Some(Instant::now() - std::time::Duration::from_millis(1));
        p.woke();
        assert_eq!(p.waits.count, 2);
        assert!(p.waits.max_us >= 3000 && p.waits.max_us < 1_000_000);
        assert!(p.waits.total_us >= p.waits.max_us + 1000);
        assert!(p.waiting_since.is_none());
    }
}
