//! Device models of pagefold: serial console, i8042 reset, the workload
//! control device, and virtio-mmio with virtio-blk, virtio-net and
//! virtio-balloon.

pub mod bus;
pub mod i8042;
pub mod serial;
pub mod virtio;
pub mod workload;

/// Guest memory as every device and the VMM hold it: vm-memory's mmap
/// backend with a dirty bitmap. Each write made through vm-memory (a used
/// ring entry, a block request's status byte, a received frame) sets its
/// page's bit, which the VMM hands to the dedup engine beside KVM's dirty
/// log: KVM sees only the guest's own writes, and a device write to a
/// merged page the engine did not hear of would leave its books stale.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;
