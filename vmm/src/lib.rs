//! pagefold's VMM: KVM VMs with guest RAM, vCPUs, devices, and the dedup
//! engine attached to guest memory.

pub mod linux;
pub mod workload_image;
