//! Disks of either guest kind: virtio-blk devices on virtio-mmio, each in
//! its standard slot (window and GSI, [`crate::virtio_mmio`]). Linux
//! guests find them through ACPI (or the command line), the workload guest
//! through its parameter block; the attachment is the same, so it lives
//! here, apart from both.

use kvm_ioctls::VmFd;
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::block::WriteHook;
use pagefold_devices::virtio::Block;
use pagefold_devices::GuestMemoryMmap;

use crate::config::DiskConfig;
use crate::virtio_mmio::{Subscriber, VirtioMmioDevice};

/// Errors of disk attachment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("disk {path}: {message}")]
    Disk { path: String, message: String },
    #[error("virtio-mmio device {index}: {source}")]
    Transport {
        index: usize,
        #[source]
        source: crate::virtio_mmio::Error,
    },
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
        let attached =
            crate::virtio_mmio::attach(slot, Box::new(block), "virtio-blk", vm_fd, mem, mmio)
                .map_err(|source| Error::Transport { index: i, source })?;
        out.subscribers.push(attached.notifier);
        out.slots.push(slot);
        out.sectors.push(sectors);
    }
    Ok(out)
}
