//! The dedup engine's write log for a VM's RAM: KVM's dirty log of the
//! memslot that maps it (`pagefold_dedup::writelog`).
//!
//! KVM records every guest write to a memslot created with
//! `KVM_MEM_LOG_DIRTY_PAGES`; `KVM_GET_DIRTY_LOG` returns the pages written
//! since the previous call and write-protects them again, so the next
//! guest write to each costs one fault. The engine collects once per
//! wake-up: a page the guest did not write since the engine last examined
//! it needs no pagemap read and no new hash.
//!
//! Device writes are not KVM's to log: the VMM's own threads write guest
//! memory through its host mapping (used ring entries, status bytes,
//! received frames). Those that go through vm-memory mark the guest
//! memory's dirty bitmap (`pagefold_devices::GuestMemoryMmap`), which
//! each collection reads and clears beside KVM's log. Without it, a merged
//! page only a device writes (a virtqueue's used ring) would stay counted
//! as merged after its copy on write until the engine's periodic full
//! check.

use std::sync::Arc;

use kvm_ioctls::VmFd;
use pagefold_dedup::{WriteLog, WriteLogError};
use pagefold_devices::GuestMemoryMmap;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MmapRegion};

/// One memslot's dirty log, with the device writes to its region.
pub struct KvmDirtyLog {
    vm_fd: Arc<VmFd>,
    slot: u32,
    len: usize,
    mem: GuestMemoryMmap,
}

impl KvmDirtyLog {
    /// The log of memslot `slot`, which maps region `slot` of `mem` and
    /// must have been created with `KVM_MEM_LOG_DIRTY_PAGES`.
    pub fn new(vm_fd: Arc<VmFd>, slot: u32, mem: &GuestMemoryMmap) -> Option<Self> {
        let region = mem.iter().nth(slot as usize)?;
        Some(Self {
            vm_fd,
            slot,
            len: region.len() as usize,
            mem: mem.clone(),
        })
    }
}

impl WriteLog for KvmDirtyLog {
    fn collect(&self, bits: &mut [u64]) -> Result<(), WriteLogError> {
        // The devices' marks first: a device write made after this read
        // is in the next one, as a guest write made after KVM's is.
        if let Some(region) = self.mem.iter().nth(self.slot as usize) {
            let devices = MmapRegion::bitmap(region).get_and_reset();
            for (b, d) in bits.iter_mut().zip(devices) {
                *b |= d;
            }
        }
        let log = self.vm_fd.get_dirty_log(self.slot, self.len).map_err(|e| {
            WriteLogError::Read(format!("KVM_GET_DIRTY_LOG slot {}: {e}", self.slot))
        })?;
        for (b, l) in bits.iter_mut().zip(log) {
            *b |= l;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
    use vm_memory::{Bytes, GuestAddress};

    /// A write a device makes through vm-memory (a used ring entry, say)
    /// is in the next collection and only that one, beside the guest's:
    /// KVM's log alone never shows it. Needs /dev/kvm (root).
    #[test]
    fn a_device_write_through_vm_memory_is_logged_once() {
        let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
        let vm_fd = Arc::new(kvm.create_vm().expect("create a VM"));
        let mem = crate::memory::create(4 << 20).unwrap();
        let region = mem.iter().next().unwrap();
        let r = kvm_userspace_memory_region {
            slot: 0,
            flags: KVM_MEM_LOG_DIRTY_PAGES,
            guest_phys_addr: 0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: `mem` maps the region and outlives `vm_fd`'s use here
        // (no vCPU runs; the slot only logs).
        unsafe { vm_fd.set_user_memory_region(r) }.unwrap();
        let log = KvmDirtyLog::new(vm_fd.clone(), 0, &mem).unwrap();
        let pages = (4 << 20) / 4096;
        let mut bits = vec![0u64; pages / 64];
        log.collect(&mut bits).unwrap();
        bits.fill(0);
        // Two bytes across pages 5 and 6, as a device's store would.
        mem.write_obj(0xabcdu16, GuestAddress(6 * 4096 - 1))
            .unwrap();
        log.collect(&mut bits).unwrap();
        let set: Vec<usize> = (0..pages)
            .filter(|&p| bits[p / 64] >> (p % 64) & 1 == 1)
            .collect();
        assert_eq!(set, vec![5, 6]);
        bits.fill(0);
        log.collect(&mut bits).unwrap();
        assert!(bits.iter().all(|&w| w == 0), "a write is collected once");
        assert!(KvmDirtyLog::new(vm_fd, 1, &mem).is_none(), "no region 1");
    }
}
