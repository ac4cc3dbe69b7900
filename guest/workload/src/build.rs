//! BUILD: the modelled build (`pagefold_guest_abi::build`). Reads the source
//! tree on disk 0 through virtio-blk into the page cache part of the build
//! area (the disk area), then runs the shared compile-and-link code over it.
//! Page-cache, object and heap pages follow the VM's placement
//! (`[vm.workload] placement`); in a linear VM the build scatters them
//! itself (keyed by `private_seed`) unless told `build:linear`, so they sit
//! where a real guest's allocator might put them.

use crate::clock::Clock;
use crate::host;
use crate::phases::Workload;
use crate::virtio::{BlockDev, DiskError, DEPTH, MAX_REQUEST_BYTES, STATUS_OK};
use pagefold_guest_abi::build::{
    area_pages, compile_and_link, BuildArea, Perm, TreeError, TreeHeader,
};
use pagefold_guest_abi::classes::DataLayout;
use pagefold_guest_abi::disk::SECTORS_PER_PAGE;
use pagefold_guest_abi::generator::PageWords;
use pagefold_guest_abi::mailbox::{PhaseReport, NO_MISMATCH};
use pagefold_guest_abi::placement::Placement;
use pagefold_guest_abi::{phase, PAGE_SIZE};

/// BUILD gives up when no read completes for this long (as DISK_READ).
const DISK_TIMEOUT_MS: u64 = 10_000;

/// Why BUILD ended early.
pub enum BuildFailure {
    Stopped,
    Disk(DiskError),
    /// Disk 0 holds no build tree.
    Tree(TreeError),
    /// The tree needs a larger build area than the disk area.
    TooBig {
        need: u64,
        have: u64,
    },
}

impl core::fmt::Display for BuildFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Stopped => write!(f, "stopped"),
            Self::Disk(e) => write!(f, "{e}"),
            Self::Tree(e) => write!(f, "{e}"),
            Self::TooBig { need, have } => write!(
                f,
                "the tree needs a build area of {need} pages, the disk area holds {have}"
            ),
        }
    }
}

/// The build area in guest memory: logical slot -> disk-area page.
struct GuestArea {
    layout: DataLayout,
    perm: Perm,
}

impl GuestArea {
    fn gpa(&self, slot: u64) -> u64 {
        self.layout.disk_page_gpa(self.perm.map(slot))
    }

    /// Disk-area pages contiguous in guest-physical memory from logical
    /// slot `slot` on (at most `max`): one read request can cover them.
    fn run(&self, slot: u64, max: u64) -> u64 {
        if self.perm.a != 1 {
            return 1;
        }
        let k = self.perm.map(slot);
        let mut n = self.layout.disk_run(k).min(max);
        // The identity may wrap (b != 0): stop at the end of the area.
        n = n.min(self.perm.n - k);
        n.max(1)
    }
}

impl BuildArea for GuestArea {
    fn page(&mut self, slot: u64) -> &mut PageWords {
        // SAFETY: `perm` maps into `[0, disk_pages)`, whose pages
        // DataLayout::new checked lie in the data areas the VMM gave us
        // (identity-mapped RAM, page aligned). One vCPU; the build code holds
        // one page at a time (the `&mut self` borrow).
        unsafe { &mut *(self.gpa(slot) as *mut PageWords) }
    }
}

/// Reads disk pages `[first, first + count)` into logical slots of the
/// same numbers, up to DEPTH requests in flight.
fn read_pages(
    dev: &mut BlockDev,
    area: &GuestArea,
    first: u64,
    count: u64,
    clock: &Clock,
) -> Result<(), DiskError> {
    let max_pages = MAX_REQUEST_BYTES / PAGE_SIZE;
    let end = first + count;
    let mut req = [0u64; DEPTH];
    let mut free = [true; DEPTH];
    let mut next = first;
    let mut inflight = 0usize;
    let mut last = clock.elapsed_us();
    let mut spins = 0u32;
    while next < end || inflight > 0 {
        let mut submitted = false;
        for s in 0..DEPTH {
            if next >= end {
                break;
            }
            if !free[s] {
                continue;
            }
            let n = area.run(next, (end - next).min(max_pages));
            dev.submit_read(
                s,
                next * SECTORS_PER_PAGE,
                area.gpa(next),
                (n * PAGE_SIZE) as u32,
            );
            req[s] = next;
            free[s] = false;
            next += n;
            inflight += 1;
            submitted = true;
        }
        if submitted {
            dev.notify();
        }
        let mut progressed = false;
        while let Some(c) = dev.poll() {
            if c.status != STATUS_OK {
                return Err(DiskError::Io {
                    sector: req[c.slot] * SECTORS_PER_PAGE,
                    status: c.status,
                });
            }
            free[c.slot] = true;
            inflight -= 1;
            progressed = true;
        }
        if progressed {
            spins = 0;
            last = clock.elapsed_us();
            continue;
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 {
            let idle_ms = clock.elapsed_us().saturating_sub(last) / 1000;
            if idle_ms >= DISK_TIMEOUT_MS {
                let s = (0..DEPTH).find(|&s| !free[s]).unwrap_or(0);
                return Err(DiskError::Timeout {
                    sector: req[s] * SECTORS_PER_PAGE,
                    ms: idle_ms,
                });
            }
        }
        core::hint::spin_loop();
    }
    Ok(())
}

impl Workload {
    /// BUILD: page cache from disk 0, compile every file, link. Arg 1:
    /// linear placement; otherwise scattered.
    pub fn build(&mut self, slot: usize, arg: u64) -> Result<PhaseReport, BuildFailure> {
        let layout = self.store.layout;
        let n = layout.disk_pages;
        // The disk area already follows the VM's placement
        // (`DataLayout::disk_page_gpa`). A VM with a placement of its own
        // keeps it; in a linear VM the build scatters its area itself
        // (the default: a real guest's allocator does), unless arg 1.
        let own = arg != 1 && layout.placement == Placement::Linear;
        let perm = if own {
            Perm::scattered(n, self.params.private_seed)
        } else {
            Perm::linear(n)
        };
        let mut area = GuestArea { layout, perm };
        let clock = Clock::start(self.params.tsc_khz);
        let mut dev = BlockDev::init(self.params.disk_mmio[0]).map_err(BuildFailure::Disk)?;
        let result = self.build_with(&mut dev, &mut area, &clock, slot);
        dev.ack_interrupts();
        dev.reset();
        result
    }

    fn build_with(
        &mut self,
        dev: &mut BlockDev,
        area: &mut GuestArea,
        clock: &Clock,
        slot: usize,
    ) -> Result<PhaseReport, BuildFailure> {
        let sectors = dev.sectors();
        if sectors < SECTORS_PER_PAGE {
            return Err(BuildFailure::Disk(DiskError::TooSmall {
                sectors,
                needed: SECTORS_PER_PAGE,
            }));
        }
        read_pages(dev, area, 0, 1, clock).map_err(BuildFailure::Disk)?;
        let h = TreeHeader::parse(area.page(0)).map_err(BuildFailure::Tree)?;
        let t = h.tree_pages;
        if area_pages(t) > area.perm.n {
            return Err(BuildFailure::TooBig {
                need: area_pages(t),
                have: area.perm.n,
            });
        }
        if sectors < t * SECTORS_PER_PAGE {
            return Err(BuildFailure::Disk(DiskError::TooSmall {
                sectors,
                needed: t * SECTORS_PER_PAGE,
            }));
        }
        read_pages(dev, area, 1, t - 1, clock).map_err(BuildFailure::Disk)?;
        let io_us = clock.elapsed_us();
        let files = u64::from(h.spec.files);
        // PROGRESS about every 1/64 of the files (and so a stop lands).
        let every = (files / 64).max(1);
        let stats = compile_and_link(area, &h, |done, total| {
            if (done % every == 0 || done == total)
                && host::stopped(host::progress(phase::BUILD, done, total))
            {
                return Err(BuildFailure::Stopped);
            }
            Ok(())
        })?;
        let cpu_us = clock.elapsed_us().saturating_sub(io_us);
        crate::log!(
            "build: {} files, {} tree pages, {} object pages, {} output pages, checksum {:#018x}, io {} us, cpu {} us",
            files,
            t,
            stats.object_pages,
            stats.output_pages,
            stats.checksum,
            io_us,
            cpu_us
        );
        Ok(PhaseReport {
            phase: phase::BUILD,
            slot: slot as u32,
            pages: t,
            bytes: t * PAGE_SIZE,
            first_mismatch: NO_MISMATCH,
            checksum: stats.checksum,
            pages_written: stats.pages_written,
            pages_reused: stats.pages_reused,
            cpu_us,
            ..PhaseReport::default()
        })
    }
}
