//! Raw access to the data area: logical pages and their version records.

use pagefold_guest_abi::classes::{record_header, DataLayout};
use pagefold_guest_abi::generator::PageWords;
use pagefold_guest_abi::WorkloadParams;

/// The data area of validated parameters.
pub struct Store {
    pub layout: DataLayout,
}

impl Store {
    /// Writes every record page: its header, and version 0 (never written)
    /// for every entry.
    pub fn init(params: &WorkloadParams, layout: DataLayout) -> Self {
        let s = Self { layout };
        for k in 0..layout.record_pages {
            let page = s.slot(k);
            page.fill(0);
            let h = record_header(params, k);
            page[0] = h[0];
            page[1] = h[1];
        }
        s
    }

    fn slot(&self, slot: u64) -> &'static mut PageWords {
        // SAFETY: DataLayout::new checked that every slot lies in the data
        // areas the VMM gave us (identity-mapped RAM, GPA == VA, page aligned,
        // above the image). One vCPU; callers hold one page at a time.
        unsafe { &mut *(self.layout.slot_gpa(slot) as *mut PageWords) }
    }

    /// Logical page `i`, in the slot the VM's placement gives it.
    pub fn page(&self, i: u64) -> &'static mut PageWords {
        self.slot(self.layout.page_slot(i))
    }

    /// Disk-area page `k` (`k < layout.disk_pages`).
    pub fn disk_page(&self, k: u64) -> &'static mut PageWords {
        self.slot(self.layout.disk_slot(k))
    }

    pub fn version(&self, i: u64) -> u32 {
        // SAFETY: record_gpa is inside a record page (see `slot`), 4-aligned.
        unsafe { (self.layout.record_gpa(i) as *const u32).read() }
    }

    pub fn set_version(&self, i: u64, v: u32) {
        // SAFETY: as `version`.
        unsafe { (self.layout.record_gpa(i) as *mut u32).write(v) }
    }
}
