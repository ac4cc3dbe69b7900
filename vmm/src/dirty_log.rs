//! The dedup engine's write log for a VM's RAM: KVM's dirty log of the
//! memslot that maps it (`pagefold_dedup::writelog`).
//!
//! KVM records every guest write to a memslot created with
//! `KVM_MEM_LOG_DIRTY_PAGES`; `KVM_GET_DIRTY_LOG` returns the pages written
//! since the previous call and write-protects them again, so the next
//! guest write to each costs one fault. The engine collects once per
//! wake-up: a page the guest did not write since the engine last examined
//! it needs no pagemap read and no new hash. Device writes are not KVM's
//! to log; the engine learns of virtio-blk's from its I/O hints.

use std::sync::Arc;

use kvm_ioctls::VmFd;
use pagefold_dedup::{WriteLog, WriteLogError};

/// One memslot's dirty log.
pub struct KvmDirtyLog {
    vm_fd: Arc<VmFd>,
    slot: u32,
    len: usize,
}

impl KvmDirtyLog {
    /// The log of memslot `slot` (`len` bytes), which must have been
    /// created with `KVM_MEM_LOG_DIRTY_PAGES`.
    pub fn new(vm_fd: Arc<VmFd>, slot: u32, len: usize) -> Self {
        Self { vm_fd, slot, len }
    }
}

impl WriteLog for KvmDirtyLog {
    fn collect(&self, bits: &mut [u64]) -> Result<(), WriteLogError> {
        let log = self.vm_fd.get_dirty_log(self.slot, self.len).map_err(|e| {
            WriteLogError::Read(format!("KVM_GET_DIRTY_LOG slot {}: {e}", self.slot))
        })?;
        for (b, l) in bits.iter_mut().zip(log) {
            *b |= l;
        }
        Ok(())
    }
}
