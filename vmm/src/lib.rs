//! pagefold's VMM: KVM VMs with guest RAM, vCPUs, devices, and the dedup
//! engine attached to guest memory.

pub mod affinity;
pub mod balloon;
pub mod config;
pub mod control;
pub mod dedup;
pub mod dirty_log;
pub mod disk;
pub mod host_kind;
pub mod linux;
pub mod memory;
pub mod net;
pub mod nic;
pub mod pause;
pub mod quiesce;
pub mod runner;
pub mod seccomp;
pub mod seed;
pub mod signals;
pub mod state;
pub mod stdin;
pub mod vcpu;
pub mod vcpu_stats;
pub mod virtio_mmio;
pub mod vm;
pub mod workload;
pub mod x86;
