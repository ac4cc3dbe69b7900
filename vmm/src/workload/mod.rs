//! Wires the built-in workload guest to a VM: turns the config into the
//! guest's parameter block and puts the control device on the VM's ports.
//! The guest's image is in [`image`], its CPL3 boot state in [`boot`]; its
//! disks are attached like a Linux guest's ([`crate::disk`]).

pub mod boot;
pub mod image;
pub mod merge_probe;
pub mod pauses;

use std::sync::{Arc, Mutex};

use pagefold_devices::workload::{DeviceAction, WorkloadControl, WorkloadDevice};
use pagefold_devices::GuestMemoryMmap;
use pagefold_guest_abi::build;
use pagefold_guest_abi::classes::{DataLayout, ParamsError, MIN_DATA_START};
use pagefold_guest_abi::disk::{MAX_DISKS, SECTORS_PER_PAGE, SECTOR_SIZE};
use pagefold_guest_abi::{phase, WorkloadParams, PAGE_SIZE, PARAMS_MAGIC};
use vmm_sys_util::eventfd::EventFd;

use crate::config::{fmt_size, Phase, WorkloadConfig};
use crate::memory::MMIO_HOLE_END;
pub use crate::seed::name_seed;
use crate::vcpu::ControlPort;

pub use pagefold_devices::workload::WorkloadControl as Control;
pub use pagefold_devices::workload::WorkloadEvent as Event;

/// Errors of workload set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("workload: {0}")]
    Config(String),
    #[error("workload needs {need} of guest RAM for its pages, but only {have} are usable in this VM; give the VM more memory or the workload less")]
    TooBig { need: String, have: String },
}

const MIB2: u64 = 2 << 20;

/// Bytes of guest RAM the guest needs per data page: the page plus its
/// 4-byte version record (records are packed into record pages).
pub fn bytes_per_page() -> u64 {
    PAGE_SIZE + 4
}

/// A disk as the workload guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestDisk {
    /// Guest-physical base of its virtio-mmio window.
    pub mmio: u64,
    /// Size in 512-byte sectors.
    pub sectors: u64,
}

impl GuestDisk {
    /// The disks `disk::attach_disks` attached, in order.
    pub fn from_attached(d: &crate::disk::Disks) -> Vec<GuestDisk> {
        d.slots
            .iter()
            .zip(&d.sectors)
            .map(|(s, &sectors)| GuestDisk {
                mmio: s.addr,
                sectors,
            })
            .collect()
    }
}

/// Builds the parameter block for a VM with RAM `ranges`, whose image ends at
/// `image_end`, and no disks.
pub fn params(
    w: &WorkloadConfig,
    vm_name: &str,
    vm_index: usize,
    ranges: &[(u64, u64)],
    image_end: u64,
    tsc_khz: u64,
) -> Result<WorkloadParams, Error> {
    params_with_disks(w, vm_name, vm_index, ranges, image_end, tsc_khz, &[])
}

/// Pages the disk area needs: the largest disk-read of the program, where
/// `disk-read` without a count reads all of disk 0 (its whole pages), or
/// the build area of a tree filling disk 0.
fn disk_area_pages(phases: &[Phase], disks: &[GuestDisk]) -> Result<u64, Error> {
    let mut pages = 0;
    for ph in phases {
        if let Phase::Build(_) = *ph {
            let disk = disks.first().ok_or_else(|| {
                Error::Config("the build phase needs a disk (workload.disks, or --disk)".into())
            })?;
            // The build area: page cache, objects and output of a tree as
            // large as the disk, plus the heap.
            pages = pages.max(build::area_pages(disk.sectors / SECTORS_PER_PAGE));
            continue;
        }
        let Phase::DiskRead(n) = *ph else { continue };
        let disk = disks.first().ok_or_else(|| {
            Error::Config("the disk-read phase needs a disk (workload.disks, or --disk)".into())
        })?;
        let whole = disk.sectors / SECTORS_PER_PAGE;
        if whole == 0 {
            return Err(Error::Config(format!(
                "disk 0 has {} bytes: disk-read needs at least one whole 4 KiB page",
                disk.sectors * SECTOR_SIZE
            )));
        }
        let n = if n == 0 { whole } else { n };
        if n > whole {
            return Err(Error::Config(format!(
                "disk-read:{n} reads {n} pages, but disk 0 holds only {whole} whole 4 KiB pages"
            )));
        }
        pages = pages.max(n);
    }
    Ok(pages)
}

/// As [`params`], for a VM whose disks are `disks` (in order; disk-read
/// reads disk 0). The disk area is sized for the program's largest
/// disk-read and comes out of the RAM the default shared/private sizes are
/// computed from.
#[allow(clippy::too_many_arguments)]
pub fn params_with_disks(
    w: &WorkloadConfig,
    vm_name: &str,
    vm_index: usize,
    ranges: &[(u64, u64)],
    image_end: u64,
    tsc_khz: u64,
    disks: &[GuestDisk],
) -> Result<WorkloadParams, Error> {
    w.validate().map_err(Error::Config)?;
    if disks.len() > MAX_DISKS {
        return Err(Error::Config(format!(
            "{} disks: a workload VM has at most {MAX_DISKS}",
            disks.len()
        )));
    }
    let phases = w.parsed_phases().map_err(Error::Config)?;
    let disk_pages = disk_area_pages(&phases, disks)?;
    let data_start = (image_end.div_ceil(MIB2) * MIB2).max(MIN_DATA_START);
    let low_end = ranges.first().map(|(a, l)| a + l).unwrap_or(0);
    if data_start >= low_end {
        return Err(Error::TooBig {
            need: fmt_size(data_start),
            have: fmt_size(low_end),
        });
    }
    let (high_start, high_end) = match ranges.get(1) {
        Some(&(a, l)) => (a, a + l),
        None => (0, 0),
    };
    debug_assert!(high_start == 0 || high_start >= MMIO_HOLE_END);
    let usable = (low_end - data_start) + (high_end - high_start);
    let disk_bytes = disk_pages * PAGE_SIZE;
    if disk_bytes >= usable {
        return Err(Error::TooBig {
            need: fmt_size(disk_bytes),
            have: fmt_size(usable),
        });
    }
    let capacity = (usable - disk_bytes) / bytes_per_page();
    let pages = |s: &Option<crate::config::SizeValue>, default_share: u64| -> Result<u64, Error> {
        Ok(match s {
            Some(v) => v.bytes().map_err(|e| Error::Config(e.to_string()))? / PAGE_SIZE,
            None => capacity * default_share / 100,
        })
    };
    let shared_pages = pages(&w.shared, 50)?;
    let private_pages = pages(&w.private, 25)?;
    if shared_pages + private_pages > capacity {
        return Err(Error::TooBig {
            need: fmt_size((shared_pages + private_pages) * bytes_per_page()),
            have: fmt_size(usable - disk_bytes),
        });
    }
    if shared_pages + private_pages == 0 {
        return Err(Error::Config(
            "the workload has no pages (shared and private are both 0)".into(),
        ));
    }
    let mut p = WorkloadParams {
        magic: PARAMS_MAGIC,
        vm_index: vm_index as u64,
        seed: w.seed,
        private_seed: w.private_seed.unwrap_or_else(|| name_seed(vm_name)),
        shared_pages,
        private_pages,
        zero_permille: w.zero_permille,
        dup_permille: w.dup_permille,
        churn_permille: w.churn_permille,
        churn_rate: w.churn_rate,
        churn_ms: w.churn_ms,
        tsc_khz,
        data_start,
        data_end: low_end,
        high_start,
        high_end,
        disk_count: disks.len() as u64,
        disk_pages,
        disk_seed: w.disk_seed.unwrap_or(0),
        ..Default::default()
    };
    w.placement(vm_name).write_params(&mut p);
    for (slot, d) in p.disk_mmio.iter_mut().zip(disks) {
        *slot = d.mmio;
    }
    for (i, ph) in phases.iter().enumerate() {
        let (op, arg) = match *ph {
            Phase::Fill => (phase::FILL, 0),
            Phase::Churn(ms) => (phase::CHURN, ms),
            Phase::Verify => (phase::VERIFY, 0),
            Phase::Rewrite => (phase::REWRITE, 0),
            Phase::Sleep(ms) => (phase::SLEEP, ms),
            Phase::WaitHost(ms) => (phase::WAIT_HOST, ms),
            Phase::Fault => (phase::FAULT, 0),
            Phase::BadPort => (phase::BAD_PORT_WRITE, 0),
            Phase::DiskRead(pages) => (phase::DISK_READ, pages),
            Phase::Build(placement) => (phase::BUILD, placement),
            Phase::Latency(ms) => (phase::LATENCY, ms),
            Phase::LatencyWrite(ms) => (phase::LATENCY_WRITE, ms),
            Phase::ProbeMerge(ms) => (phase::PROBE_MERGE, ms),
        };
        p.program[i] = op;
        p.program_args[i] = arg;
    }
    // The guest checks the same rules; refusing here gives a clear error
    // before the VM starts.
    match DataLayout::new(&p) {
        Ok(_) => Ok(p),
        Err(ParamsError::TooManyPages { needed, available }) => Err(Error::TooBig {
            need: fmt_size(needed * PAGE_SIZE),
            have: fmt_size(available * PAGE_SIZE),
        }),
        Err(e) => Err(Error::Config(e.to_string())),
    }
}

/// Adapts the control device to the vCPU exit loop. After each doorbell
/// (the guest ran an operation, which may have produced a report) it wakes
/// the process event loop, so reports are printed as they happen.
struct Port {
    dev: WorkloadDevice,
    wake: Arc<EventFd>,
}

impl ControlPort for Port {
    fn write(&mut self, port: u16, data: &[u8]) -> Result<Option<u32>, String> {
        let r = self.dev.pio_write(port, data);
        if port == pagefold_guest_abi::ports::DOORBELL {
            let _ = self.wake.write(1);
        }
        match r {
            Ok(DeviceAction::Continue) => Ok(None),
            Ok(DeviceAction::Exit(status)) => Ok(Some(status)),
            Err(e) => Err(format!("workload control device: {e}")),
        }
    }

    fn read(&mut self, port: u16, data: &mut [u8]) -> Result<(), String> {
        self.dev.pio_read(port, data);
        Ok(())
    }
}

/// Creates the control device for a VM.
#[allow(clippy::type_complexity)]
pub fn device(
    vm_name: &str,
    params: WorkloadParams,
    mem: GuestMemoryMmap,
    events: crossbeam_channel::Sender<Event>,
    wake: Arc<EventFd>,
) -> Result<(Arc<Mutex<dyn ControlPort>>, Arc<WorkloadControl>), Error> {
    let control = Arc::new(WorkloadControl::new());
    let dev = WorkloadDevice::new(vm_name.to_string(), params, mem, events, control.clone());
    Ok((Arc::new(Mutex::new(Port { dev, wake })), control))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_from_config() {
        let w = WorkloadConfig {
            shared: Some(crate::config::SizeValue::Text("64M".into())),
            private: Some(crate::config::SizeValue::Text("16M".into())),
            phases: vec!["fill".into(), "sleep:5".into(), "verify".into()],
            ..Default::default()
        };
        let p = params(&w, "a", 0, &[(0, 256 << 20)], 0x23_4567, 1000).unwrap();
        assert_eq!(p.data_start, 4 << 20);
        assert_eq!(p.data_end, 256 << 20);
        assert_eq!(p.shared_pages, 16384);
        assert_eq!(p.private_pages, 4096);
        assert_eq!(
            &p.program[..4],
            &[phase::FILL, phase::SLEEP, phase::VERIFY, phase::END]
        );
        assert_eq!(p.program_args[1], 5);
        assert_eq!(p.private_seed, name_seed("a"));
        assert_ne!(name_seed("a"), name_seed("b"));
        let big = WorkloadConfig {
            shared: Some(crate::config::SizeValue::Text("300M".into())),
            ..Default::default()
        };
        let e = params(&big, "a", 0, &[(0, 256 << 20)], 0x20_0000, 0).unwrap_err();
        assert!(e.to_string().contains("only"), "{e}");
    }

    #[test]
    fn params_carry_the_placement() {
        let mut w = WorkloadConfig {
            shared: Some(crate::config::SizeValue::Text("8M".into())),
            private: Some(crate::config::SizeValue::Text("4M".into())),
            ..Default::default()
        };
        let ram = [(0, 64 << 20)];
        let p = params(&w, "a", 0, &ram, 0x20_0000, 0).unwrap();
        assert_eq!((p.placement, p.extent_pages, p.placement_seed), (0, 0, 0));
        w.placement = crate::config::PlacementKind::Scattered;
        w.extent_pages = Some(8);
        let a = params(&w, "a", 0, &ram, 0x20_0000, 0).unwrap();
        let b = params(&w, "b", 1, &ram, 0x20_0000, 0).unwrap();
        assert_eq!((a.placement, a.extent_pages), (1, 8));
        assert_ne!(a.placement_seed, b.placement_seed);
        assert_ne!(a.placement_seed, a.private_seed);
        let (la, lb) = (DataLayout::new(&a).unwrap(), DataLayout::new(&b).unwrap());
        assert!((0..la.pages).any(|i| la.page_gpa(i) != lb.page_gpa(i)));
    }

    #[test]
    fn params_with_a_disk() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let img = file.path().to_path_buf();
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let w = WorkloadConfig {
            shared: Some(crate::config::SizeValue::Text("16M".into())),
            private: Some(crate::config::SizeValue::Text("0M".into())),
            phases: vec!["fill".into(), "disk-read".into(), "disk-read:3".into()],
            disks: vec![crate::config::DiskConfig {
                path: img.clone(),
                readonly: true,
            }],
            disk_seed: Some(9),
            ..Default::default()
        };
        let disk = GuestDisk {
            mmio: 0xd000_0000,
            sectors: 8 * 100 + 5,
        };
        let ram = [(0, 64 << 20)];
        let p = params_with_disks(&w, "a", 0, &ram, 0x20_0000, 0, &[disk]).unwrap();
        // Whole pages of disk 0; the largest read sizes the area.
        assert_eq!(p.disk_pages, 100);
        assert_eq!(p.disk_count, 1);
        assert_eq!(p.disk_mmio, [0xd000_0000, 0, 0, 0]);
        assert_eq!(p.disk_seed, 9);
        assert_eq!(&p.program[1..3], &[phase::DISK_READ, phase::DISK_READ]);
        assert_eq!(&p.program_args[1..3], &[0, 3]);
        assert_eq!(p.disk_read_pages(), 100);
        // Reading past the disk, or with no disk, is refused up front.
        let mut long = w.clone();
        long.phases = vec!["fill".into(), "disk-read:101".into()];
        let e = params_with_disks(&long, "a", 0, &ram, 0x20_0000, 0, &[disk]).unwrap_err();
        assert!(e.to_string().contains("holds only 100"), "{e}");
        let e = params_with_disks(&w, "a", 0, &ram, 0x20_0000, 0, &[]).unwrap_err();
        assert!(e.to_string().contains("needs a disk"), "{e}");
        // The disk area comes out of the default sizes' share of RAM.
        let mut dflt = w.clone();
        dflt.shared = None;
        dflt.private = None;
        let big = GuestDisk {
            mmio: 0xd000_0000,
            sectors: 8 * 8192,
        };
        let p = params_with_disks(&dflt, "a", 0, &ram, 0x20_0000, 0, &[big]).unwrap();
        let usable = (64 << 20) - (4 << 20);
        let capacity = (usable - 8192 * PAGE_SIZE) / bytes_per_page();
        assert_eq!(p.shared_pages, capacity / 2);
        assert!(DataLayout::new(&p).is_ok());
        // A disk no phase reads is announced but gets no area.
        let mut none = w.clone();
        none.phases = vec!["fill".into()];
        let p = params_with_disks(&none, "a", 0, &ram, 0x20_0000, 0, &[disk]).unwrap();
        assert_eq!((p.disk_count, p.disk_pages), (1, 0));
    }
}
