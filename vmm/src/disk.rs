//! Disks of either guest kind: virtio-blk devices on virtio-mmio, each in
//! its standard slot (window and GSI). Linux guests find them through ACPI
//! (or the command line), the workload guest through its parameter block;
//! the attachment is the same, so it lives here, apart from both.

use std::sync::{Arc, Mutex};

use event_manager::MutEventSubscriber;
use kvm_ioctls::{IoEventAddress, VmFd};
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::block::WriteHook;
use pagefold_devices::virtio::NOTIFY_REG_OFFSET;
use pagefold_devices::virtio::{Block, MmioNotifier, MmioTransport};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::config::DiskConfig;

/// virtio-mmio device windows: device `n` at VIRTIO_MMIO_BASE + n * VIRTIO_MMIO_SIZE
/// (in the MMIO hole below 4 GiB, for both guest kinds).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// virtio-mmio device `n` uses GSI VIRTIO_IRQ_BASE + n (edge triggered).
pub const VIRTIO_IRQ_BASE: u32 = 5;

/// Errors of disk attachment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("disk {path}: {message}")]
    Disk { path: String, message: String },
    #[error("virtio-mmio device {index}: {message}")]
    Transport { index: usize, message: String },
    #[error("KVM {what}: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("{0}")]
    Other(String),
}

/// An event-loop subscriber a VM needs (virtio notifications here, the
/// Linux guest's PM events).
pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// One virtio-mmio device window and its GSI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioMmioDevice {
    pub addr: u64,
    pub size: u64,
    pub irq: u32,
}

impl VirtioMmioDevice {
    /// The standard slot `n`: window at 0xd000_0000 + n * 4 KiB, GSI 5 + n.
    pub fn slot(n: u32) -> Self {
        Self {
            addr: VIRTIO_MMIO_BASE + u64::from(n) * VIRTIO_MMIO_SIZE,
            size: VIRTIO_MMIO_SIZE,
            irq: VIRTIO_IRQ_BASE + n,
        }
    }
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}

fn evt() -> Result<EventFd, Error> {
    EventFd::new(libc::EFD_NONBLOCK).map_err(|e| Error::Other(format!("eventfd: {e}")))
}

/// The virtio-blk disks of a VM, attached to its MMIO bus.
pub struct Disks {
    /// Where each disk's virtio-mmio window is, in disk order.
    pub slots: Vec<VirtioMmioDevice>,
    /// Each disk's size in 512-byte sectors.
    pub sectors: Vec<u64>,
    /// The queue-notification subscribers the event loop must run.
    pub subscribers: Vec<Subscriber>,
}

impl Disks {
    /// The MMIO windows as `(start, len)`, for page tables.
    pub fn windows(&self) -> Vec<(u64, u64)> {
        self.slots.iter().map(|s| (s.addr, s.size)).collect()
    }
}

/// Attaches `disks` as virtio-blk devices on virtio-mmio: disk `n` at
/// `VirtioMmioDevice::slot(n)`, with an irqfd for its GSI and an ioeventfd
/// on its QueueNotify register (so a notification does not stop the vCPU;
/// the returned subscriber runs the queue on the event loop). Linux guests
/// and workload guests share this.
pub fn attach_disks(
    name: &str,
    disks: &[DiskConfig],
    vm_fd: &VmFd,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
    filled: Option<&WriteHook>,
) -> Result<Disks, Error> {
    let mut out = Disks {
        slots: Vec::new(),
        sectors: Vec::new(),
        subscribers: Vec::new(),
    };
    for (i, disk) in disks.iter().enumerate() {
        let slot = VirtioMmioDevice::slot(i as u32);
        let serial = format!("{name}-vd{i}");
        let serial = &serial[..serial.len().min(20)];
        let mut block =
            Block::open(&disk.path, disk.readonly, serial).map_err(|e| Error::Disk {
                path: disk.path.display().to_string(),
                message: e.to_string(),
            })?;
        if let Some(hook) = filled {
            block.set_write_hook(hook.clone());
        }
        let sectors = block.nsectors();
        let irqfd = evt()?;
        vm_fd
            .register_irqfd(&irqfd, slot.irq)
            .map_err(kvm("irqfd for virtio-blk"))?;
        let transport = MmioTransport::new(mem.clone(), Box::new(block), irqfd).map_err(|e| {
            Error::Transport {
                index: i,
                message: e.to_string(),
            }
        })?;
        for (q, qevt) in transport.queue_evts().iter().enumerate() {
            vm_fd
                .register_ioevent(
                    qevt,
                    &IoEventAddress::Mmio(slot.addr + NOTIFY_REG_OFFSET),
                    q as u32,
                )
                .map_err(kvm("ioeventfd for virtio-blk"))?;
        }
        let transport = Arc::new(Mutex::new(transport));
        mmio.insert(transport.clone(), slot.addr, slot.size)
            .map_err(|e| Error::Other(e.to_string()))?;
        let notifier = MmioNotifier::new(transport).map_err(|e| Error::Transport {
            index: i,
            message: e.to_string(),
        })?;
        out.subscribers.push(Arc::new(Mutex::new(notifier)));
        out.slots.push(slot);
        out.sectors.push(sectors);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MMIO_HOLE_END, MMIO_HOLE_START};
    use pagefold_guest_abi::disk::MAX_DISKS;

    #[test]
    fn every_slot_a_guest_may_use_is_in_the_mmio_hole_with_its_own_gsi() {
        assert_eq!(
            VirtioMmioDevice::slot(0),
            VirtioMmioDevice {
                addr: 0xd000_0000,
                size: 0x1000,
                irq: 5
            }
        );
        let slots: Vec<_> = (0..MAX_DISKS as u32).map(VirtioMmioDevice::slot).collect();
        for (i, s) in slots.iter().enumerate() {
            assert!(
                s.addr >= MMIO_HOLE_START && s.addr + s.size <= MMIO_HOLE_END,
                "{s:?}"
            );
            // The IOAPIC has 24 pins; 0-4 belong to legacy devices (COM1 is 4).
            assert!((5..=23).contains(&s.irq), "{s:?}");
            if let Some(next) = slots.get(i + 1) {
                assert!(s.addr + s.size <= next.addr, "{s:?} overlaps {next:?}");
                assert_ne!(s.irq, next.irq);
            }
        }
    }
}
