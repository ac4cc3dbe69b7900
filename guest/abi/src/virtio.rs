//! The virtio-mmio and virtio-blk numbers the workload guest's driver uses:
//! one table for the guest. The host's device model takes the same numbers
//! from the virtio-bindings crate, which needs `std` and so cannot be built
//! into the freestanding guest; a devices test asserts the two agree.

/// "virt" in little endian: the MagicValue register.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// The register layout version (virtio 1.x "modern" virtio-mmio).
pub const MMIO_VERSION: u32 = 2;
/// Device ID of a block device.
pub const DEVICE_ID_BLOCK: u32 = 2;

/// virtio-mmio register offsets (virtio 1.x, 4.2.2).
pub mod reg {
    pub const MAGIC: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const SHM_LEN_LOW: u64 = 0x0b0;
    pub const SHM_LEN_HIGH: u64 = 0x0b4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    /// Device-specific config; virtio-blk's `capacity` (u64, sectors) first.
    pub const CONFIG: u64 = 0x100;
}

/// Device status bits (virtio 1.x, 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const NEEDS_RESET: u32 = 64;
    pub const FAILED: u32 = 128;
}

/// VIRTIO_F_VERSION_1: feature bit 32.
pub const F_VERSION_1: u32 = 32;

/// Split-virtqueue descriptor flag: the chain continues at `next`.
pub const DESC_F_NEXT: u16 = 1;
/// Split-virtqueue descriptor flag: the device writes this buffer.
pub const DESC_F_WRITE: u16 = 2;
/// Available-ring flag: the driver wants no used-buffer interrupt.
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// virtio-blk request type: read sectors.
pub const BLK_T_IN: u32 = 0;
/// virtio-blk status byte: success.
pub const BLK_S_OK: u8 = 0;

/// The virtio-blk request header (`struct virtio_blk_outhdr`, 16 bytes)
/// the driver puts first in every request's descriptor chain.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlkReqHeader {
    /// `BLK_T_*`.
    pub type_: u32,
    /// `ioprio` in the spec; always 0 here.
    pub reserved: u32,
    /// First sector (512 bytes each) of the transfer.
    pub sector: u64,
}

const _: () = assert!(core::mem::size_of::<BlkReqHeader>() == 16);
