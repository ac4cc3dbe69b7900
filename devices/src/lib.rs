//! Device models of pagefold: serial console, i8042 reset, the workload
//! control device, and virtio-mmio with virtio-blk, virtio-net and
//! virtio-balloon.

pub mod bus;
pub mod i8042;
pub mod serial;
pub mod virtio;
pub mod workload;
