//! Regions joining and leaving the core.

use super::*;

impl Core {
    /// Adds a region and registers it with the uffd.
    ///
    /// # Safety
    /// `addr..addr + len` must be a private anonymous mapping of this
    /// process that stays mapped while the region is registered: until
    /// [`Core::unregister`] for the returned id has returned, or the core
    /// is dropped. Until then the engine reads it, write-protects it,
    /// and replaces its pages with mappings that hold the same bytes
    /// (`mm::map_pool_fixed` and the other primitives of the merge path).
    #[cfg(any(test, feature = "testing"))]
    pub unsafe fn register(
        &mut self,
        addr: usize,
        len: usize,
        owner: String,
        group: String,
    ) -> Result<RegionId, ScanError> {
        // SAFETY: this function's contract, passed on.
        unsafe { self.register_in(addr, len, owner, group, Default::default()) }
    }

    /// [`Core::register`] into a group of the given security; the group's
    /// other regions, if any, must have the same.
    ///
    /// # Safety
    /// As [`Core::register`].
    pub unsafe fn register_in(
        &mut self,
        addr: usize,
        len: usize,
        owner: String,
        group: String,
        security: crate::backend::Security,
    ) -> Result<RegionId, ScanError> {
        // Before the overlap check, which needs `addr + len`.
        region::check_bounds(addr, len)?;
        let end = addr + len;
        if self
            .regions
            .iter()
            .any(|r| addr < r.addr + r.len() && r.addr < end)
        {
            return Err(ScanError::Overlap { addr, len });
        }
        let gid = self.ids.group(&group);
        if let Some(other) = self.regions.iter().find(|r| r.group == gid) {
            if other.security != security {
                return Err(ScanError::SecurityMismatch {
                    group,
                    has: other.security,
                    asked: security,
                });
            }
        }
        let (id, base) = self.ids.peek()?;
        let mut r = Region::new(id, addr, len, owner, group, gid, base)?;
        r.security = security;
        r.huge = mm::thp_possible();
        self.uffd.register_wp(addr, len)?;
        r.slot_base = self.pool.open_window(r.npages);
        self.ids.take(r.npages);
        self.prot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .regions
            .push((addr, end));
        self.regions.push(r);
        self.grow_unstable();
        if self.assist.group() == Some(gid) {
            let ri = self.regions.len() - 1;
            self.hand_to_ksm(ri);
        }
        Ok(id)
    }

    /// Sizes the unstable index for every tracked page, keeping this pass's
    /// entries (their key is the stored hash of a still-HASHED page).
    fn grow_unstable(&mut self) {
        let pages = self.tracked_pages() as usize;
        let regions = &self.regions;
        // A stale id of a removed region is dropped by `locate_in` (its
        // bounds check), never read past a region's end.
        let key_of = |gid: u32| -> Option<u32> {
            let (ri, p) = locate_in(regions, gid)?;
            let r = &regions[ri];
            (region::kind(r.state[p]) == HASHED).then(|| r.word[p])
        };
        self.unstable.grow(pages, key_of);
    }

    /// Removes a region. With `unmerge`, its merged pages first get private
    /// copies back (the memory stays usable); without, the caller promised
    /// to unmap it right away, so its pool references are simply dropped,
    /// and the region's mappings are first replaced by one fresh anonymous
    /// mapping (see [`Core::drop_mappings`]).
    ///
    /// # Safety
    /// Without `unmerge`, the region's memory reads as zeros afterwards: the
    /// caller never reads or writes it again (it is about to unmap it).
    /// With `unmerge` there is nothing to guarantee.
    pub unsafe fn unregister(&mut self, id: RegionId, unmerge: bool) -> Result<(), ScanError> {
        self.quiescers.remove(&id);
        let ri = self
            .regions
            .iter()
            .position(|r| r.id == id)
            .ok_or(ScanError::Unknown(id.0))?;
        if unmerge && !self.take_from_ksm(ri) {
            return Err(ScanError::Assist(
                "could not take the region back from KSM".into(),
            ));
        }
        // SAFETY: without `unmerge`, this function's caller never touches
        // the region again (its contract).
        let dropped = !unmerge && unsafe { self.drop_mappings(ri) };
        let mut freed = Vec::new();
        if unmerge {
            // Retry a few times: a page that cannot be protected right now
            // (e.g. a concurrent discard) is rare and transient.
            for _ in 0..3 {
                if self.unmerge_region(ri, &mut freed, false) == Some(0) {
                    break;
                }
            }
        }
        {
            let r = &mut self.regions[ri];
            let orphans_before = self.orphans.len();
            for i in 0..r.npages {
                if region::kind(r.state[i]) == MERGED {
                    let s = r.word[i];
                    if unmerge {
                        // The unmerge failed here, so the page still maps
                        // its slot, and the owner goes on using the memory.
                        // Freeing the slot would make the page read zeros,
                        // and later another page's content: its reference
                        // stays, and the slot is kept (docs/merge-races.md
                        // §14).
                        self.orphans.push(s);
                    } else if drop_mapper(&mut self.pool, &mut self.stable, s) == 0 {
                        freed.push(s);
                    }
                    r.set_kind(i, NEW);
                }
            }
            let kept = self.orphans.len() - orphans_before;
            if kept > 0 {
                log::warn!(
                    "region {} left with {kept} pages it could not unmerge; \
                     their pool pages stay allocated while this process runs",
                    id.0
                );
            }
        }
        let r = self.regions.remove(ri);
        if let Some(b) = r.slot_base {
            self.pool.close_window(b);
        }
        if !dropped {
            let _ = self.uffd.unregister(r.addr, r.len());
        }
        {
            let mut p = self.prot.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pos) = p
                .regions
                .iter()
                .position(|&x| x == (r.addr, r.addr + r.len()))
            {
                p.regions.swap_remove(pos);
            }
        }
        self.release_unmapped(&freed);
        self.release_deferred();
        self.release_assist_if_unused();
        self.cursor.region_removed(ri, self.regions.len());
        Ok(())
    }

    /// Replaces region `ri`'s mappings (one VMA per scattered merge) with
    /// one fresh anonymous mapping, for a region its owner unmaps right
    /// after: one unmap of every VMA, one batch of TLB flushes. Without it,
    /// the uffd unregistration (a write-protect clear and TLB flush per VMA)
    /// and the hole punches of the freed slots (a zap and flush per VMA still
    /// mapping them) would each interrupt the CPUs running the other VMs'
    /// vCPUs, once per VMA. The new mapping is not registered with
    /// userfaultfd, and nothing maps the freed slots any more when they are
    /// punched. False (nothing changed) when the mmap fails.
    ///
    /// # Safety
    /// The region's owner never reads or writes it again (it is about to
    /// unmap it).
    unsafe fn drop_mappings(&self, ri: usize) -> bool {
        let r = &self.regions[ri];
        // SAFETY: the region is a page-aligned private mapping of this
        // process (register contract) that nothing reads or writes again
        // (this function's contract).
        match unsafe { crate::mm::map_anon_fixed(r.addr, r.len()) } {
            Ok(()) => true,
            Err(e) => {
                log::warn!("dropping the mappings of region {}: {e}", r.id.0);
                false
            }
        }
    }
}
