//! virtio-mmio slots and the wiring every virtio device of a VM gets: a
//! 4 KiB window and a GSI per slot, an irqfd for that GSI, an ioeventfd
//! per queue on the QueueNotify register (so a notification does not stop
//! the vCPU: the returned subscriber runs the queue on the event loop),
//! and the transport on the VM's MMIO bus. Disks, NICs and the balloon
//! are attached through [`attach`].

use std::sync::{Arc, Mutex};

use event_manager::MutEventSubscriber;
use kvm_ioctls::{IoEventAddress, VmFd};
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::{MmioNotifier, MmioTransport, VirtioDevice, NOTIFY_REG_OFFSET};
use pagefold_devices::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// virtio-mmio device windows: device `n` at VIRTIO_MMIO_BASE + n * VIRTIO_MMIO_SIZE
/// (in the MMIO hole below 4 GiB, for both guest kinds).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// virtio-mmio device `n` uses GSI VIRTIO_IRQ_BASE + n (edge triggered).
pub const VIRTIO_IRQ_BASE: u32 = 5;

/// Errors wiring a device; the caller says which device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("KVM {what} for {device}: {source}")]
    Kvm {
        what: &'static str,
        device: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("virtio-mmio transport: {0}")]
    Transport(#[from] pagefold_devices::virtio::mmio::Error),
    #[error("MMIO bus: {0}")]
    Bus(String),
    #[error("queue notifier: {0}")]
    Notifier(String),
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

/// A device attached by [`attach`].
pub struct Attached {
    /// The transport, on the MMIO bus (for device-specific wiring: a tap
    /// watcher, a balloon's target).
    pub transport: Arc<Mutex<MmioTransport>>,
    /// Runs the queues when their ioeventfds fire.
    pub notifier: Subscriber,
}

/// Puts `device` in `slot`: an irqfd for the slot's GSI, the transport on
/// `mmio`, an ioeventfd per queue at the window's QueueNotify register
/// with the queue's index as datamatch, and the notifier that runs them.
/// `kind` names the device kind in KVM errors.
pub fn attach(
    slot: VirtioMmioDevice,
    device: Box<dyn VirtioDevice>,
    kind: &'static str,
    vm_fd: &VmFd,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
) -> Result<Attached, Error> {
    let kvm = |what| {
        move |source| Error::Kvm {
            what,
            device: kind,
            source,
        }
    };
    let irqfd = EventFd::new(libc::EFD_NONBLOCK).map_err(Error::EventFd)?;
    vm_fd
        .register_irqfd(&irqfd, slot.irq)
        .map_err(kvm("irqfd"))?;
    let transport = MmioTransport::new(mem.clone(), device, irqfd)?;
    for (q, qevt) in transport.queue_evts().iter().enumerate() {
        vm_fd
            .register_ioevent(
                qevt,
                &IoEventAddress::Mmio(slot.addr + NOTIFY_REG_OFFSET),
                q as u32,
            )
            .map_err(kvm("ioeventfd"))?;
    }
    let transport = Arc::new(Mutex::new(transport));
    mmio.insert(transport.clone(), slot.addr, slot.size)
        .map_err(|e| Error::Bus(e.to_string()))?;
    let notifier =
        MmioNotifier::new(transport.clone()).map_err(|e| Error::Notifier(e.to_string()))?;
    Ok(Attached {
        transport,
        notifier: Arc::new(Mutex::new(notifier)),
    })
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
