//! The virtio-mmio transport, version 2 (virtio 1.x spec, 4.2.2).
//!
//! It keeps the register state a driver sees (feature selects, status,
//! queue configuration, interrupt status, config generation), owns the
//! virtqueues, and forwards notifications to a [`VirtioDevice`]. Malformed
//! accesses (bad width, writes in the wrong state) are ignored with a log
//! line: a guest can never crash the VMM through these registers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::GuestMemoryMmap;
use log::{debug, warn};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{VirtioDevice, VIRTIO_F_VERSION_1};
use crate::bus::BusDevice;

/// "virt" in little endian (virtio-bindings has no constant for it): the
/// guest's own table in pagefold-guest-abi.
pub use pagefold_guest_abi::virtio::{MMIO_MAGIC, MMIO_VERSION};
/// Vendor ID reported to the guest ("PGFD").
pub const VENDOR_ID: u32 = 0x4446_4750;

/// Register offsets (virtio 1.x, 4.2.2), from virtio-bindings' `VIRTIO_MMIO_*`
/// as `u64` bus offsets (the names follow the virtio 1.x spec: the driver
/// and device areas are bindings' legacy "avail" and "used").
pub mod reg {
    use virtio_bindings::virtio_mmio as b;

    pub const MAGIC: u64 = b::VIRTIO_MMIO_MAGIC_VALUE as u64;
    pub const VERSION: u64 = b::VIRTIO_MMIO_VERSION as u64;
    pub const DEVICE_ID: u64 = b::VIRTIO_MMIO_DEVICE_ID as u64;
    pub const VENDOR_ID: u64 = b::VIRTIO_MMIO_VENDOR_ID as u64;
    pub const DEVICE_FEATURES: u64 = b::VIRTIO_MMIO_DEVICE_FEATURES as u64;
    pub const DEVICE_FEATURES_SEL: u64 = b::VIRTIO_MMIO_DEVICE_FEATURES_SEL as u64;
    pub const DRIVER_FEATURES: u64 = b::VIRTIO_MMIO_DRIVER_FEATURES as u64;
    pub const DRIVER_FEATURES_SEL: u64 = b::VIRTIO_MMIO_DRIVER_FEATURES_SEL as u64;
    pub const QUEUE_SEL: u64 = b::VIRTIO_MMIO_QUEUE_SEL as u64;
    pub const QUEUE_NUM_MAX: u64 = b::VIRTIO_MMIO_QUEUE_NUM_MAX as u64;
    pub const QUEUE_NUM: u64 = b::VIRTIO_MMIO_QUEUE_NUM as u64;
    pub const QUEUE_READY: u64 = b::VIRTIO_MMIO_QUEUE_READY as u64;
    pub const QUEUE_NOTIFY: u64 = b::VIRTIO_MMIO_QUEUE_NOTIFY as u64;
    pub const INTERRUPT_STATUS: u64 = b::VIRTIO_MMIO_INTERRUPT_STATUS as u64;
    pub const INTERRUPT_ACK: u64 = b::VIRTIO_MMIO_INTERRUPT_ACK as u64;
    pub const STATUS: u64 = b::VIRTIO_MMIO_STATUS as u64;
    pub const QUEUE_DESC_LOW: u64 = b::VIRTIO_MMIO_QUEUE_DESC_LOW as u64;
    pub const QUEUE_DESC_HIGH: u64 = b::VIRTIO_MMIO_QUEUE_DESC_HIGH as u64;
    pub const QUEUE_DRIVER_LOW: u64 = b::VIRTIO_MMIO_QUEUE_AVAIL_LOW as u64;
    pub const QUEUE_DRIVER_HIGH: u64 = b::VIRTIO_MMIO_QUEUE_AVAIL_HIGH as u64;
    pub const QUEUE_DEVICE_LOW: u64 = b::VIRTIO_MMIO_QUEUE_USED_LOW as u64;
    pub const QUEUE_DEVICE_HIGH: u64 = b::VIRTIO_MMIO_QUEUE_USED_HIGH as u64;
    pub const SHM_LEN_LOW: u64 = b::VIRTIO_MMIO_SHM_LEN_LOW as u64;
    pub const SHM_LEN_HIGH: u64 = b::VIRTIO_MMIO_SHM_LEN_HIGH as u64;
    pub const CONFIG_GENERATION: u64 = b::VIRTIO_MMIO_CONFIG_GENERATION as u64;
    pub const CONFIG: u64 = b::VIRTIO_MMIO_CONFIG as u64;
}

/// Interrupt state shared between the transport and whoever raises
/// interrupts: the InterruptStatus bits and the irqfd.
pub struct Interrupt {
    status: AtomicU32,
    irqfd: EventFd,
}

impl Interrupt {
    /// `irqfd` is the EventFd the VMM registered with KVM for the device's GSI.
    pub fn new(irqfd: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            irqfd,
        }
    }

    /// Sets `bits` in InterruptStatus and signals the irqfd.
    pub fn trigger(&self, bits: u32) {
        self.status.fetch_or(bits, Ordering::SeqCst);
        if let Err(e) = self.irqfd.write(1) {
            warn!("virtio-mmio: cannot signal irqfd: {e}");
        }
    }

    /// The current InterruptStatus value.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }
}

/// A virtio device behind the virtio-mmio register interface.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
    /// Per queue: the driver wrote an invalid size or a misaligned ring
    /// address. Such a queue fails activation (DEVICE_NEEDS_RESET).
    queue_config_error: Vec<bool>,
    queue_evts: Vec<EventFd>,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    status: u32,
    config_generation: u32,
    activated: bool,
}

/// Errors of transport construction.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create a queue eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("invalid maximum queue size {0}")]
    QueueSize(u16),
    #[error("the device does not offer VIRTIO_F_VERSION_1")]
    NotModern,
}

impl MmioTransport {
    /// Wraps `device`. `irqfd` is signalled for every interrupt; the VMM
    /// registers it with KVM (`register_irqfd`) for the device's GSI.
    pub fn new(
        mem: GuestMemoryMmap,
        device: Box<dyn VirtioDevice>,
        irqfd: EventFd,
    ) -> Result<Self, Error> {
        if device.avail_features() & (1 << VIRTIO_F_VERSION_1) == 0 {
            return Err(Error::NotModern);
        }
        let mut queues = Vec::new();
        let mut queue_evts = Vec::new();
        for &max in device.queue_max_sizes() {
            queues.push(Queue::new(max).map_err(|_| Error::QueueSize(max))?);
            queue_evts.push(EventFd::new(EFD_NONBLOCK).map_err(Error::EventFd)?);
        }
        Ok(Self {
            device,
            mem,
            interrupt: Arc::new(Interrupt::new(irqfd)),
            queue_config_error: vec![false; queues.len()],
            queues,
            queue_evts,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            status: 0,
            config_generation: 0,
            activated: false,
        })
    }

    /// One EventFd per queue. The VMM registers queue `i`'s EventFd as an
    /// ioeventfd at `base + NOTIFY_REG_OFFSET` with 32-bit datamatch `i`
    /// and feeds them to an [`super::MmioNotifier`].
    pub fn queue_evts(&self) -> &[EventFd] {
        &self.queue_evts
    }

    /// The interrupt state (InterruptStatus + irqfd).
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// The device status register as the driver last set it.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Whether the device was activated (DRIVER_OK accepted).
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    /// The queues (for inspection by the VMM and tests).
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    /// Each queue's indices as the device and the driver hold them now.
    pub fn queue_states(&self) -> Vec<super::QueueState> {
        self.queues
            .iter()
            .map(|q| super::QueueState::read(q, &self.mem))
            .collect()
    }

    /// Tells the driver the config space changed: bumps ConfigGeneration
    /// and raises the configuration-change interrupt.
    pub fn notify_config_change(&mut self) {
        self.config_generation = self.config_generation.wrapping_add(1);
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            self.interrupt.trigger(VIRTIO_MMIO_INT_CONFIG);
        }
    }

    /// Processes queue `index` as if the driver had notified it. Used by
    /// MMIO writes to QueueNotify and by the ioeventfd handler.
    pub fn notify_queue(&mut self, index: usize) {
        if !self.activated || self.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0 {
            debug!("virtio-mmio: notify of queue {index} while not active");
            return;
        }
        let Some(queue) = self.queues.get_mut(index) else {
            warn!("virtio-mmio: notify of nonexistent queue {index}");
            return;
        };
        match self.device.process_queue(index, queue, &self.mem) {
            Ok(true) => self.interrupt.trigger(VIRTIO_MMIO_INT_VRING),
            Ok(false) => {}
            Err(e) => self.set_needs_reset(&e),
        }
    }

    fn set_needs_reset(&mut self, e: &super::Error) {
        warn!("virtio-mmio: device needs reset: {e}");
        self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            self.interrupt.trigger(VIRTIO_MMIO_INT_CONFIG);
        }
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers may change only between FEATURES_OK and DRIVER_OK,
    /// and only while the queue is not ready (4.2.3.2).
    fn queue_writable(&mut self) -> bool {
        let s = self.status;
        s & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && s & (VIRTIO_CONFIG_S_DRIVER_OK | VIRTIO_CONFIG_S_FAILED) == 0
            && self.selected_queue().is_some_and(|q| !q.ready())
    }

    fn reset(&mut self) {
        self.device.reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.queue_config_error.fill(false);
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.queue_sel = 0;
        self.status = 0;
        self.activated = false;
        self.interrupt.clear();
    }

    fn write_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        if v & VIRTIO_CONFIG_S_FAILED != 0 {
            self.status |= VIRTIO_CONFIG_S_FAILED;
            return;
        }
        // The driver sets one more bit at a time, in the order of 3.1.1;
        // it never clears bits except by a reset. NEEDS_RESET is the
        // device's bit and is kept.
        let keep = self.status & VIRTIO_CONFIG_S_NEEDS_RESET;
        let old = self.status & !VIRTIO_CONFIG_S_NEEDS_RESET;
        let new = v & !VIRTIO_CONFIG_S_NEEDS_RESET;
        if new & old != old {
            warn!("virtio-mmio: status {v:#x} clears bits of {old:#x}; ignored");
            return;
        }
        let added = new & !old;
        let allowed = match added {
            0 => true,
            VIRTIO_CONFIG_S_ACKNOWLEDGE => old == 0,
            VIRTIO_CONFIG_S_DRIVER => old == VIRTIO_CONFIG_S_ACKNOWLEDGE,
            VIRTIO_CONFIG_S_FEATURES_OK => {
                old == VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER
                    && self.features_acceptable()
            }
            VIRTIO_CONFIG_S_DRIVER_OK => {
                old == VIRTIO_CONFIG_S_ACKNOWLEDGE
                    | VIRTIO_CONFIG_S_DRIVER
                    | VIRTIO_CONFIG_S_FEATURES_OK
            }
            _ => false,
        };
        if !allowed {
            // For FEATURES_OK this is the spec's way of refusing the
            // feature set: the driver reads the status back and sees the
            // bit clear.
            warn!("virtio-mmio: status transition {old:#x} -> {v:#x} refused");
            return;
        }
        self.status = new | keep;
        if added == VIRTIO_CONFIG_S_DRIVER_OK {
            self.activate();
        }
    }

    fn features_acceptable(&self) -> bool {
        let offered = self.device.avail_features();
        self.acked_features & !offered == 0 && self.acked_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        // Queues that exist only with a feature the driver did not ack are
        // not set up, and need not be.
        let in_use = self.device.queues_in_use(self.acked_features);
        let broken = self
            .queues
            .iter()
            .zip(&self.queue_config_error)
            .take(in_use)
            .position(|(q, &bad)| bad || !q.ready() || !q.is_valid(&self.mem));
        let result = match broken {
            Some(i) => Err(super::Error::QueueNotReady(i)),
            None => {
                let event_idx = self.acked_features
                    & (1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX)
                    != 0;
                for q in &mut self.queues {
                    q.set_event_idx(event_idx);
                }
                self.device
                    .activate(self.acked_features, &mut self.queues, &self.mem)
            }
        };
        match result {
            Ok(()) => self.activated = true,
            Err(e) => self.set_needs_reset(&e),
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        let q = self.queues.get(self.queue_sel as usize);
        match offset {
            reg::MAGIC => MMIO_MAGIC,
            reg::VERSION => MMIO_VERSION,
            reg::DEVICE_ID => self.device.device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.avail_features() as u32,
                1 => (self.device.avail_features() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => q.map_or(0, |q| u32::from(q.max_size())),
            reg::QUEUE_READY => q.map_or(0, |q| u32::from(q.ready())),
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status,
            reg::QUEUE_DESC_LOW => q.map_or(0, |q| q.desc_table() as u32),
            reg::QUEUE_DESC_HIGH => q.map_or(0, |q| (q.desc_table() >> 32) as u32),
            reg::QUEUE_DRIVER_LOW => q.map_or(0, |q| q.avail_ring() as u32),
            reg::QUEUE_DRIVER_HIGH => q.map_or(0, |q| (q.avail_ring() >> 32) as u32),
            reg::QUEUE_DEVICE_LOW => q.map_or(0, |q| q.used_ring() as u32),
            reg::QUEUE_DEVICE_HIGH => q.map_or(0, |q| (q.used_ring() >> 32) as u32),
            // No shared memory regions: their length reads as all ones (4.2.2).
            reg::SHM_LEN_LOW | reg::SHM_LEN_HIGH => u32::MAX,
            reg::CONFIG_GENERATION => self.config_generation,
            _ => {
                debug!("virtio-mmio: read of unknown register {offset:#x}");
                0
            }
        }
    }

    fn write_reg(&mut self, offset: u64, v: u32) {
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            reg::DRIVER_FEATURES => {
                let s = self.status;
                if s & VIRTIO_CONFIG_S_DRIVER == 0 || s & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
                    warn!("virtio-mmio: driver features written in status {s:#x}; ignored");
                    return;
                }
                let (mask, shift) = match self.driver_features_sel {
                    0 => (0xffff_ffffu64, 0),
                    1 => (0xffff_ffff_0000_0000u64, 32),
                    _ => return,
                };
                self.acked_features = (self.acked_features & !mask) | (u64::from(v) << shift);
            }
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::QUEUE_NUM => {
                if self.queue_writable() {
                    let sel = self.queue_sel as usize;
                    // Sizes above the maximum or not a power of two are
                    // refused by virtio-queue; the queue then fails
                    // activation and the device asks for a reset.
                    if let Err(e) = self.queues[sel].try_set_size(v as u16) {
                        warn!("virtio-mmio: queue {sel}: size {v}: {e}");
                        self.queue_config_error[sel] = true;
                    }
                }
            }
            reg::QUEUE_READY => {
                let s = self.status;
                if s & VIRTIO_CONFIG_S_FEATURES_OK != 0 && s & VIRTIO_CONFIG_S_DRIVER_OK == 0 {
                    if let Some(q) = self.selected_queue() {
                        q.set_ready(v == 1);
                    }
                }
            }
            reg::QUEUE_NOTIFY => self.notify_queue(v as usize),
            reg::INTERRUPT_ACK => self.interrupt.ack(v),
            reg::STATUS => self.write_status(v),
            reg::QUEUE_DESC_LOW
            | reg::QUEUE_DESC_HIGH
            | reg::QUEUE_DRIVER_LOW
            | reg::QUEUE_DRIVER_HIGH
            | reg::QUEUE_DEVICE_LOW
            | reg::QUEUE_DEVICE_HIGH => {
                if !self.queue_writable() {
                    warn!("virtio-mmio: queue address written in the wrong state; ignored");
                    return;
                }
                let sel = self.queue_sel as usize;
                let q = &mut self.queues[sel];
                let which = offset & !4;
                let old = match which {
                    reg::QUEUE_DESC_LOW => q.desc_table(),
                    reg::QUEUE_DRIVER_LOW => q.avail_ring(),
                    _ => q.used_ring(),
                };
                let addr = if offset & 4 == 0 {
                    (old & !0xffff_ffff) | u64::from(v)
                } else {
                    (old & 0xffff_ffff) | (u64::from(v) << 32)
                };
                let r = match which {
                    reg::QUEUE_DESC_LOW => q.try_set_desc_table_address(GuestAddress(addr)),
                    reg::QUEUE_DRIVER_LOW => q.try_set_avail_ring_address(GuestAddress(addr)),
                    _ => q.try_set_used_ring_address(GuestAddress(addr)),
                };
                if let Err(e) = r {
                    warn!("virtio-mmio: queue {sel}: ring address {addr:#x}: {e}");
                    self.queue_config_error[sel] = true;
                }
            }
            _ => debug!("virtio-mmio: write of unknown register {offset:#x}"),
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= reg::CONFIG {
            self.device.read_config(offset - reg::CONFIG, data);
            return;
        }
        if data.len() != 4 || offset % 4 != 0 {
            warn!(
                "virtio-mmio: {}-byte read at {offset:#x}; registers are 32 bits",
                data.len()
            );
            data.fill(0);
            return;
        }
        let v = self.read_reg(offset);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            if self.status & VIRTIO_CONFIG_S_FAILED == 0 {
                self.device.write_config(offset - reg::CONFIG, data);
            }
            return;
        }
        if data.len() != 4 || offset % 4 != 0 {
            warn!(
                "virtio-mmio: {}-byte write at {offset:#x}; registers are 32 bits",
                data.len()
            );
            return;
        }
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        self.write_reg(offset, v);
    }
}

#[cfg(test)]
pub(crate) mod tests;
