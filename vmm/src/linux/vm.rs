//! The Linux side of VM creation: the guest's disks (attached by
//! [`crate::disk`], as for workload guests), network interfaces
//! ([`crate::net`]) and balloon ([`crate::balloon`]), the ACPI
//! power-management port,
//! the kernel and its boot data, and the 64-bit kernel-mode entry state of
//! every vCPU.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use kvm_ioctls::{VcpuFd, VmFd};
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::block::WriteHook;
use pagefold_devices::GuestMemoryMmap;
use vm_memory::GuestAddress;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::balloon::{self, attach_balloon, BalloonDevice, DedupTarget};
use crate::config::KernelConfig;
use crate::disk::{self, attach_disks};
use crate::linux::{
    self, layout::ACPI_PM_PORT, pm::AcpiPmDevice, DeviceDiscovery, LinuxBootConfig,
};
use crate::net::{self, attach_nets};
use crate::nic::NicDevice;
use crate::state::{Outcome, VmShared};
use crate::virtio_mmio::Subscriber;

/// Errors of Linux VM set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Disk(#[from] disk::Error),
    #[error(transparent)]
    Net(#[from] net::Error),
    #[error(transparent)]
    Balloon(#[from] balloon::Error),
    #[error(transparent)]
    Boot(#[from] linux::Error),
    #[error("{0}")]
    Other(String),
}

/// Stops the VM when the guest writes the ACPI reset or sleep register.
struct PmWatcher {
    shared: Arc<VmShared>,
    reset: EventFd,
    shutdown: EventFd,
}

impl MutEventSubscriber for PmWatcher {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.reset.as_raw_fd() {
            let _ = self.reset.read();
            self.shared.request_stop(Outcome::GuestReset);
        } else if events.fd() == self.shutdown.as_raw_fd() {
            let _ = self.shutdown.read();
            self.shared.request_stop(Outcome::GuestPowerOff);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in [self.reset.as_raw_fd(), self.shutdown.as_raw_fd()] {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                log::error!("VM {}: cannot watch PM events: {e}", self.shared.name);
            }
        }
    }
}

fn evt() -> Result<EventFd, Error> {
    EventFd::new(libc::EFD_NONBLOCK).map_err(|e| Error::Other(format!("eventfd: {e}")))
}

/// The command line the guest gets. When the user asks for the serial
/// console and says nothing of an early console, the early console is turned
/// on as well: messages before `console_init` then reach the serial port at
/// once instead of waiting in the kernel's buffer, which matters when a boot
/// stops early (and on hosts where kernel code is emulated, it always does).
pub fn effective_cmdline(user: &str) -> String {
    let wants_serial = user
        .split_whitespace()
        .any(|w| w.starts_with("console=ttyS0"));
    let has_early = user
        .split_whitespace()
        .any(|w| w.starts_with("earlyprintk") || w.starts_with("earlycon"));
    if wants_serial && !has_early {
        format!("{user} earlyprintk=serial,ttyS0,115200")
    } else {
        user.to_string()
    }
}

/// What [`setup`] made that the VM keeps.
pub struct LinuxDevices {
    /// The subscribers the event loop must run.
    pub subscribers: Vec<Subscriber>,
    /// The balloon, if the config asks for one.
    pub balloon: Option<BalloonDevice>,
    /// The NICs, in config order.
    pub nics: Vec<NicDevice>,
}

/// Sets up a Linux guest. `filled` hears of the ranges disk reads fill,
/// `received` of those received frames are written to; `dedup` is where
/// the balloon gives pages back (see [`DedupTarget`]).
#[allow(clippy::too_many_arguments)]
pub fn setup(
    name: &str,
    kernel: &KernelConfig,
    vm_fd: &VmFd,
    mem: &GuestMemoryMmap,
    ram: &[(u64, u64)],
    vcpus: &[VcpuFd],
    pio: &mut Bus,
    mmio: &mut Bus,
    shared: &Arc<VmShared>,
    filled: Option<&WriteHook>,
    received: Option<&WriteHook>,
    dedup: &DedupTarget,
) -> Result<LinuxDevices, Error> {
    let disks = attach_disks(name, &kernel.disks, vm_fd, mem, mmio, filled)?;
    let mut subs = disks.subscribers;
    let mut devices = disks.slots;
    let nets = attach_nets(
        name,
        &kernel.net,
        vcpus.len(),
        devices.len(),
        vm_fd,
        mem,
        mmio,
        received,
    )?;
    subs.extend(nets.subscribers);
    devices.extend(nets.slots);
    let mut balloon = None;
    if let Some(cfg) = &kernel.balloon {
        let slot = crate::virtio_mmio::VirtioMmioDevice::slot(devices.len() as u32);
        let hook = balloon::discard_hook(mem.clone(), dedup.clone());
        let (b, s) = attach_balloon(cfg, slot, hook, vm_fd, mem, mmio)?;
        subs.extend(s);
        devices.push(slot);
        balloon = Some(b);
    }

    let (reset, shutdown) = (evt()?, evt()?);
    let pm = AcpiPmDevice::new(
        reset.try_clone().map_err(|e| Error::Other(e.to_string()))?,
        shutdown
            .try_clone()
            .map_err(|e| Error::Other(e.to_string()))?,
    );
    pio.insert(Arc::new(Mutex::new(pm)), u64::from(ACPI_PM_PORT), 1)
        .map_err(|e| Error::Other(e.to_string()))?;
    subs.push(Arc::new(Mutex::new(PmWatcher {
        shared: shared.clone(),
        reset,
        shutdown,
    })));

    let cfg = LinuxBootConfig {
        kernel: kernel.path.clone(),
        initrd: kernel.initrd.clone(),
        cmdline: effective_cmdline(&kernel.cmdline),
        ram: ram.iter().map(|&(a, l)| (GuestAddress(a), l)).collect(),
        vcpus: vcpus.len() as u8,
        virtio_devices: devices,
        discovery: DeviceDiscovery::Acpi,
    };
    let info = linux::load_linux(mem, &cfg)?;
    for (i, v) in vcpus.iter().enumerate() {
        linux::setup_cpl0_long_mode(v, mem, &info, i as u8)?;
    }
    Ok(LinuxDevices {
        subscribers: subs,
        balloon,
        nics: nets.devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_console_follows_the_serial_console() {
        assert_eq!(
            effective_cmdline("console=ttyS0 panic=-1"),
            "console=ttyS0 panic=-1 earlyprintk=serial,ttyS0,115200"
        );
        assert_eq!(
            effective_cmdline("console=ttyS0 earlycon=uart"),
            "console=ttyS0 earlycon=uart"
        );
        assert_eq!(effective_cmdline("quiet"), "quiet");
    }
}
