//! virtio-blk (virtio 1.x, 5.2) over a raw image file.
//!
//! One request queue; requests run synchronously when the driver notifies.
//! Offers VERSION_1, EVENT_IDX, FLUSH, SEG_MAX, SIZE_MAX, and RO for
//! read-only disks (writes then fail with IOERR).

pub mod disk;
pub mod request;

use std::path::Path;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_ID_BYTES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::Queue;

pub use disk::{Disk, SECTOR_SIZE};
pub use request::Limits;

use super::{VirtioDevice, VIRTIO_F_VERSION_1};

/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Maximum bytes per data segment (SIZE_MAX).
pub const SIZE_MAX: u32 = 1 << 20;
/// Maximum data segments per request (SEG_MAX): the queue minus the
/// header and status descriptors.
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;

/// Length of the config space we expose: capacity, size_max, seg_max,
/// geometry (unused, zero) and blk_size (unused, zero).
const CONFIG_LEN: usize = 24;

/// Errors creating a block device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Disk(#[from] disk::Error),
    #[error("serial id is {0} bytes; at most 20 are allowed")]
    SerialTooLong(usize),
}

/// virtio-blk's hook gets each range a read request filled from the
/// disk; the VMM feeds it to the dedup engine as an I/O hint (two VMs
/// reading one image fill identical pages; the engine visits them first).
pub use super::WriteHook;

/// A virtio-blk device model.
pub struct Block {
    disk: Disk,
    serial: Vec<u8>,
    limits: Limits,
    queue_sizes: [u16; 1],
    config: [u8; CONFIG_LEN],
    acked_features: u64,
    write_hook: Option<WriteHook>,
}

impl Block {
    /// Opens the raw image at `path`; `serial` is what GET_ID returns (at
    /// most 20 bytes).
    pub fn open(path: &Path, read_only: bool, serial: &str) -> Result<Self, Error> {
        Self::new(Disk::open(path, read_only)?, serial)
    }

    /// Wraps an open disk.
    pub fn new(disk: Disk, serial: &str) -> Result<Self, Error> {
        if serial.len() > VIRTIO_BLK_ID_BYTES as usize {
            return Err(Error::SerialTooLong(serial.len()));
        }
        let limits = Limits {
            seg_max: SEG_MAX,
            size_max: SIZE_MAX,
        };
        let mut config = [0u8; CONFIG_LEN];
        config[0..8].copy_from_slice(&disk.nsectors().to_le_bytes());
        config[8..12].copy_from_slice(&limits.size_max.to_le_bytes());
        config[12..16].copy_from_slice(&limits.seg_max.to_le_bytes());
        Ok(Self {
            disk,
            serial: serial.as_bytes().to_vec(),
            limits,
            queue_sizes: [QUEUE_SIZE],
            config,
            acked_features: 0,
            write_hook: None,
        })
    }

    /// Reports every range a read request fills to `hook`.
    pub fn set_write_hook(&mut self, hook: WriteHook) {
        self.write_hook = Some(hook);
    }

    /// Capacity in sectors, as in the config space.
    pub fn nsectors(&self) -> u64 {
        self.disk.nsectors()
    }

    /// Features the driver acknowledged at activation.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn avail_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_BLK_F_FLUSH)
            | (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_BLK_F_SIZE_MAX);
        if self.disk.read_only() {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.config, offset, data);
    }

    // `write_config`: the default. Only `writeback` (with
    // VIRTIO_BLK_F_CONFIG_WCE, not offered) is writable in virtio-blk's
    // config space.

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
        super::process_chains(index, queue, mem, |chain| {
            request::handle(
                chain,
                mem,
                &self.disk,
                &self.serial,
                self.limits,
                self.write_hook.as_deref(),
            )
            .used_len
        })
    }

    fn reset(&mut self) {
        self.acked_features = 0;
    }
}

#[cfg(test)]
mod tests;
