//! Statistics: built from the core's counters after every wake-up
//! ([`crate::scanner::Core::stats`], so `stats()` never waits for a scan in
//! progress), plus the engine threads' CPU clocks read live.
//!
//! Semantics (KSM's where KSM has the figure):
//! * `pages_shared`: pool pages mapped by at least two guest pages;
//! * `pages_sharing`: sum over pool pages of (mappers - 1), the pages saved
//!   by the pool; a pool page with one mapper saves nothing and counts 0;
//! * `zero_pages`: pages the engine dropped to the zero page (like KSM's
//!   `ksm_zero_pages`, not part of `pages_sharing`);
//! * `pages_unshared`: hashed pages, stable since their last visit, with no
//!   partner; `pages_volatile`: hashed pages whose hash changed;
//! * `bytes_saved` = (`pages_sharing` + `zero_pages`) x 4096;
//! * `vmas_created`: pool-mapping VMAs in the regions (runs of consecutive
//!   slots, recounted once per full scan);
//! * `profit_bytes` = saved - engine metadata - VMAs x 256 B of kernel memory;
//! * `pages_reported`: pages owners gave back (`DedupBackend::discard`)
//!   since the start, every page of every call; `pages_returned`: pages
//!   given back that the scan has not seen mapped since (absent: in
//!   neither `pages_sharing` nor `zero_pages`, nor in an owner's
//!   `pages_merged`).

/// CPU clocks of the engine's threads.
#[derive(Debug, Default)]
pub struct Clocks {
    live: Vec<(std::thread::ThreadId, libc::clockid_t)>,
    exited: f64,
}

impl Clocks {
    /// Registers the calling thread.
    pub fn enter(&mut self) {
        if let Some(c) = crate::mm::current_thread_clock() {
            self.live.push((std::thread::current().id(), c));
        }
    }

    /// Unregisters the calling thread, keeping its CPU time.
    pub fn leave(&mut self) {
        let me = std::thread::current().id();
        if let Some(pos) = self.live.iter().position(|&(t, _)| t == me) {
            let (_, c) = self.live.swap_remove(pos);
            self.exited += crate::mm::clock_seconds(c);
        }
    }

    /// Total CPU seconds of the engine's threads, past and present.
    pub fn seconds(&self) -> f64 {
        self.exited
            + self
                .live
                .iter()
                .map(|&(_, c)| crate::mm::clock_seconds(c))
                .sum::<f64>()
    }
}
