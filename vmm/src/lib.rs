//! pagefold's VMM: KVM VMs with guest RAM, vCPUs, devices, and the dedup
//! engine attached to guest memory.

pub mod config;
pub mod linux;
pub mod memory;
pub mod workload_image;
pub mod x86;
