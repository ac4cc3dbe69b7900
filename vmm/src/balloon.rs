//! A Linux guest's memory balloon: virtio-balloon on virtio-mmio in the
//! slot after the NICs, the discard hook that gives inflated and reported
//! pages back to the host, the target the API sets, and the timer that
//! asks the guest for its statistics.
//!
//! Pages go back through the dedup backend when it tracks the VM's RAM
//! (`DedupBackend::discard_ranges`: a merged page must leave the pool, not
//! show it), and with `MADV_DONTNEED` otherwise.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use event_manager::{EventOps, Events, MutEventSubscriber};
use kvm_ioctls::VmFd;
use pagefold_dedup::DedupBackend;
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::balloon::{
    Balloon, BalloonState, Counters, DiscardHook, Features, BALLOON_PAGE,
};
use pagefold_devices::virtio::MmioTransport;
use pagefold_devices::GuestMemoryMmap;
use serde::{Deserialize, Serialize};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

use crate::config::BalloonConfig;
use crate::virtio_mmio::{Subscriber, VirtioMmioDevice};

/// Errors of the balloon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("balloon: {0}")]
    Attach(#[from] crate::virtio_mmio::Error),
    #[error("balloon: statistics timer: {0}")]
    Timer(vmm_sys_util::errno::Error),
    #[error("balloon target {target_mib} MiB is more than the VM's {memory_mib} MiB of RAM")]
    TooLarge { target_mib: u64, memory_mib: u64 },
}

/// Where a VM's pages go back: the dedup backend while it tracks the VM's
/// RAM, none (plain `MADV_DONTNEED`) otherwise. The VM holds the write
/// lock while it registers or unregisters, so a discard never meets
/// registered memory behind the backend's back.
pub type DedupTarget = Arc<RwLock<Option<Arc<dyn DedupBackend>>>>;

/// The balloon's figures as the API shows them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BalloonStatus {
    /// The size the host asks the balloon to be, MiB.
    pub target_mib: u64,
    /// The size the guest says it has, MiB.
    pub actual_mib: u64,
    pub free_page_reporting: bool,
    pub deflate_on_oom: bool,
    /// Seconds between requests for statistics (0: none).
    pub stats_interval_s: u32,
    /// 4 KiB pages the guest put into the balloon, and took out, since
    /// the VM started.
    pub inflated_pages: u64,
    pub deflated_pages: u64,
    /// 4 KiB pages in the ranges free page reporting reported.
    pub reported_pages: u64,
    /// Pages given back to the host (inflated and reported).
    pub returned_pages: u64,
    /// Reports, statistics buffers, and malformed chains and ranges.
    pub reports: u64,
    pub stats_updates: u64,
    pub bad_chains: u64,
    pub bad_ranges: u64,
    /// The guest's last statistics (bytes for memory figures), by name;
    /// empty before the first.
    pub guest_stats: BTreeMap<String, u64>,
    /// Seconds since the guest's statistics were read (None: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_stats_age_s: Option<f64>,
}

/// The VM's end of its balloon.
pub struct BalloonDevice {
    state: Arc<BalloonState>,
    transport: Arc<Mutex<MmioTransport>>,
    config: BalloonConfig,
    memory_bytes: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl BalloonDevice {
    /// Asks the guest for a balloon of `target_mib` MiB (0 deflates it
    /// all): the config space's `num_pages`, and a configuration-change
    /// interrupt.
    pub fn set_target_mib(&self, target_mib: u64) -> Result<(), Error> {
        let memory_mib = self.memory_bytes >> 20;
        if target_mib > memory_mib {
            return Err(Error::TooLarge {
                target_mib,
                memory_mib,
            });
        }
        let pages = (target_mib << 20) / BALLOON_PAGE;
        // Guest RAM is below 2^32 pages of 4 KiB (16 TiB) by far.
        self.state
            .set_target_pages(u32::try_from(pages).unwrap_or(u32::MAX));
        lock(&self.transport).notify_config_change();
        Ok(())
    }

    /// The figures now.
    pub fn status(&self) -> BalloonStatus {
        let st = &self.state;
        let Counters {
            inflated_pages,
            deflated_pages,
            reported_pages,
            returned_pages,
            reports,
            stats_updates,
            bad_chains,
            bad_ranges,
        } = st.counters();
        let mib = |pages: u32| (u64::from(pages) * BALLOON_PAGE) >> 20;
        let stats = st.stats();
        BalloonStatus {
            target_mib: mib(st.target_pages()),
            actual_mib: mib(st.actual_pages()),
            free_page_reporting: self.config.free_page_reporting,
            deflate_on_oom: self.config.deflate_on_oom,
            stats_interval_s: self.config.stats_interval_s,
            inflated_pages,
            deflated_pages,
            reported_pages,
            returned_pages,
            reports,
            stats_updates,
            bad_chains,
            bad_ranges,
            guest_stats: stats
                .as_ref()
                .map(|s| s.values.iter().map(|(k, v)| (k.to_string(), *v)).collect())
                .unwrap_or_default(),
            guest_stats_age_s: stats
                .and_then(|s| s.at)
                .and_then(|t| t.elapsed().ok())
                .map(|d| d.as_secs_f64()),
        }
    }
}

/// Asks the guest for fresh statistics: the held buffer goes back at the
/// statistics queue's processing, run here (the event loop's thread).
fn request_stats(state: &BalloonState, transport: &Mutex<MmioTransport>) {
    state.want_stats();
    let mut t = lock(transport);
    if !t.is_activated() {
        return;
    }
    if let Some(q) = Balloon::stats_queue(t.acked_features()) {
        t.notify_queue(q);
    }
}

/// Asks for the guest's statistics every `stats_interval_s`.
struct StatsTimer {
    timer: TimerFd,
    state: Arc<BalloonState>,
    transport: Arc<Mutex<MmioTransport>>,
}

impl MutEventSubscriber for StatsTimer {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.timer.wait();
        request_stats(&self.state, &self.transport);
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new_raw(self.timer.as_raw_fd(), EventSet::IN)) {
            log::error!("balloon: cannot watch the statistics timer: {e}");
        }
    }
}

/// The hook that gives guest ranges back: split at the ends of guest
/// memory's regions, then through the dedup backend that tracks the VM's
/// RAM, or `MADV_DONTNEED`.
pub fn discard_hook(mem: GuestMemoryMmap, target: DedupTarget) -> DiscardHook {
    Arc::new(move |ranges: &[(u64, u64)]| {
        let host = host_ranges(&mem, ranges);
        let backend = target.read().unwrap_or_else(|e| e.into_inner());
        match backend.as_ref() {
            // SAFETY: the guest gave these ranges of its RAM up (inflated
            // or reported free); nothing in the VMM keeps data there.
            Some(d) => match unsafe { d.discard_ranges(&host) } {
                Ok(n) => n,
                Err(e) => {
                    log::warn!("balloon: giving pages back: {e}");
                    0
                }
            },
            None => host
                .iter()
                .map(|&(a, l)| {
                    // SAFETY: `a..+l` lies inside guest RAM, a private
                    // anonymous mapping `mem` owns and no dedup backend
                    // tracks; the guest gave its content up, and reads
                    // zeros from it afterwards.
                    match unsafe { pagefold_dedup::mm::madvise(a, l, libc::MADV_DONTNEED) } {
                        Ok(()) => (l as u64) / BALLOON_PAGE,
                        Err(e) => {
                            log::warn!("balloon: giving pages back: {e}");
                            0
                        }
                    }
                })
                .sum(),
        }
    })
}

/// Host `(address, length)` ranges of guest ranges, cut at region ends
/// (the device passes ranges inside guest RAM only).
fn host_ranges(mem: &GuestMemoryMmap, ranges: &[(u64, u64)]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(ranges.len());
    for &(gpa, len) in ranges {
        let (mut at, end) = (gpa, gpa.saturating_add(len));
        while at < end {
            let Some(r) = mem.find_region(GuestAddress(at)) else {
                break;
            };
            let off = at - r.start_addr().0;
            let n = (end - at).min(r.len() - off);
            out.push((r.as_ptr() as usize + off as usize, n as usize));
            at += n;
        }
    }
    out
}

/// Attaches the balloon of `cfg` in `slot`; returns its VM end and the
/// subscribers the event loop runs (queue notifications, the statistics
/// timer).
pub fn attach_balloon(
    cfg: &BalloonConfig,
    slot: VirtioMmioDevice,
    hook: DiscardHook,
    vm_fd: &VmFd,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
) -> Result<(BalloonDevice, Vec<Subscriber>), Error> {
    let features = Features {
        stats: cfg.stats_interval_s > 0,
        deflate_on_oom: cfg.deflate_on_oom,
        free_page_reporting: cfg.free_page_reporting,
    };
    let dev = Balloon::new(features, hook);
    let state = dev.state();
    let attached =
        crate::virtio_mmio::attach(slot, Box::new(dev), "virtio-balloon", vm_fd, mem, mmio)?;
    let mut subs = vec![attached.notifier];
    if cfg.stats_interval_s > 0 {
        let mut timer = TimerFd::new().map_err(Error::Timer)?;
        let every = Duration::from_secs(u64::from(cfg.stats_interval_s));
        timer.reset(every, Some(every)).map_err(Error::Timer)?;
        subs.push(Arc::new(Mutex::new(StatsTimer {
            timer,
            state: state.clone(),
            transport: attached.transport.clone(),
        })));
    }
    let memory_bytes = mem.iter().map(|r| r.len()).sum();
    Ok((
        BalloonDevice {
            state,
            transport: attached.transport,
            config: cfg.clone(),
            memory_bytes,
        },
        subs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_ranges_are_cut_at_region_ends() {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x10_0000), 0x10_0000),
        ])
        .unwrap();
        let r0 = mem.find_region(GuestAddress(0)).unwrap().as_ptr() as usize;
        let r1 = mem.find_region(GuestAddress(0x10_0000)).unwrap().as_ptr() as usize;
        let h = host_ranges(&mem, &[(0xf_0000, 0x2_0000), (0x1000, 0x1000)]);
        assert_eq!(
            h,
            vec![
                (r0 + 0xf_0000, 0x1_0000),
                (r1, 0x1_0000),
                (r0 + 0x1000, 0x1000)
            ]
        );
    }

    /// Without a dedup backend the hook frees the pages itself: they read
    /// zeros and are no longer present.
    #[test]
    fn without_dedup_pages_go_back_with_madv_dontneed() {
        use vm_memory::Bytes;
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        mem.write_slice(&[7u8; 0x4000], GuestAddress(0x8000))
            .unwrap();
        let hook = discard_hook(mem.clone(), DedupTarget::default());
        assert_eq!(hook(&[(0x9000, 0x2000)]), 2);
        let mut b = [0u8; 0x4000];
        mem.read_slice(&mut b, GuestAddress(0x8000)).unwrap();
        assert!(b[..0x1000].iter().all(|&x| x == 7));
        assert!(b[0x1000..0x3000].iter().all(|&x| x == 0));
        assert!(b[0x3000..].iter().all(|&x| x == 7));
    }

    #[test]
    fn a_target_above_the_vms_ram_is_refused() {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let mut mmio = Bus::new();
        let hook = discard_hook(mem.clone(), DedupTarget::default());
        let (b, subs) = attach_balloon(
            &BalloonConfig::default(),
            VirtioMmioDevice::slot(0),
            hook,
            &vm,
            &mem,
            &mut mmio,
        )
        .unwrap();
        assert_eq!(subs.len(), 2, "queue notifier and statistics timer");
        let e = b.set_target_mib(17).unwrap_err();
        assert!(e.to_string().contains("17 MiB"), "{e}");
        b.set_target_mib(8).unwrap();
        let s = b.status();
        assert_eq!((s.target_mib, s.actual_mib), (8, 0));
        // The device answers at its window: device ID 5.
        let mut id = [0u8; 4];
        assert!(mmio.read(VirtioMmioDevice::slot(0).addr + 8, &mut id));
        assert_eq!(u32::from_le_bytes(id), 5);
    }
}
