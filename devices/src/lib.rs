//! Device models of pagefold: serial console, i8042 reset, the workload
//! control device, and virtio-mmio with virtio-blk.

pub mod bus;
pub mod virtio;
pub mod workload;
