//! The interface every dedup backend offers to the VMM: pagefold's own engine
//! and the kernel-KSM backend both implement [`DedupBackend`], so the VMM, the
//! API and the benchmarks drive either one the same way.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::settings::{CheckedSettings, Knobs, Mode, SettingsError};

/// Errors shared by all backends.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting out of range or not for this backend.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// No region has this id (it was unregistered, or never was).
    #[error("unknown region id {0}")]
    UnknownRegion(u64),
    /// The range is not page aligned or is empty.
    #[error("region {addr:#x}+{len:#x} is not page aligned or is empty")]
    BadRegion {
        /// Host address of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// The range overlaps a registered region.
    #[error("region {addr:#x}+{len:#x} overlaps a registered region")]
    Overlap {
        /// Host address of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A region asks for a group's security other than the one the
    /// group's regions already have.
    #[error(
        "dedup group {group:?} is {has}, not {asked}: a group's VMs share one security setting"
    )]
    SecurityMismatch {
        /// The group.
        group: String,
        /// Its security.
        has: Security,
        /// What the new region asked for.
        asked: Security,
    },
    /// The backend cannot do this here (a kernel feature is missing, KSM
    /// is in use by another process, ...); the text says what.
    #[error("{0}")]
    Unsupported(String),
    /// A system call failed.
    #[error("{context}: {source}")]
    Os {
        /// What the backend was doing.
        context: String,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for backend operations.
pub type Result<T> = std::result::Result<T, Error>;

/// Identifies a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegionId(
    /// The number, unique for the backend's lifetime.
    pub u64,
);

/// What a dedup group promises its guests about telling merged pages from
/// others (docs/security.md). Every region of a group has the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// Merge whatever stays unchanged, as soon as the knobs allow. A guest
    /// can tell a merged page from an unmerged one by timing its first
    /// write to it (a copy-on-write fault), as under kernel KSM.
    #[default]
    Default,
    /// A merged page and an unmerged one that could have merged take the
    /// same path on their first write: only pages unchanged over two of
    /// the scan's visits are candidates, and every candidate is moved onto
    /// a pool page, shared or its own, so its first write is the same
    /// copy-on-write fault either way; zero pages are no exception (no
    /// `MADV_DONTNEED` fast path). pagefold's engine only: kernel KSM
    /// cannot do this, and the KSM assist never takes such a group.
    Hardened,
}

impl Security {
    /// The name in config files, the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Security::Default => "default",
            Security::Hardened => "hardened",
        }
    }
}

impl std::fmt::Display for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Security {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "default" => Ok(Security::Default),
            "hardened" => Ok(Security::Hardened),
            _ => Err(format!(
                "unknown dedup security {s:?} (expected default or hardened)"
            )),
        }
    }
}

/// A host memory region offered for deduplication.
#[derive(Debug, Clone)]
pub struct RegionSpec {
    /// Host virtual address of the first byte (page aligned).
    pub host_addr: usize,
    /// Length in bytes (page aligned, non-zero).
    pub len: usize,
    /// Owner, e.g. the VM's name; stats are reported per owner.
    pub owner: String,
    /// Dedup group: pages are only ever shared between regions of one group.
    pub group: String,
    /// The group's security ([`Security`]); every region of a group gives
    /// the same.
    pub security: Security,
}

/// Per-owner (per-VM) figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerStats {
    /// The owner's dedup group.
    pub group: String,
    /// Pages of the owner's registered regions.
    pub pages_tracked: u64,
    /// Pages of this owner currently mapped onto a shared pool/KSM page.
    pub pages_merged: u64,
    /// Pages of this owner currently dropped to the zero page.
    pub zero_pages: u64,
    /// What merging saves for this owner, in bytes (its share of each
    /// shared page, and its zero pages).
    pub bytes_saved: u64,
    /// Merges of this owner's pages its writes broke since registration;
    /// `None` from a backend that cannot tell per owner (kernel KSM counts
    /// its copy-on-write breaks host-wide only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cow_breaks: Option<u64>,
    /// Pages the owner gave back through [`DedupBackend::discard`] since
    /// registration (a balloon's inflated pages, free page reporting):
    /// every page of every call, a page given back twice counted twice.
    #[serde(default)]
    pub pages_reported: u64,
    /// Of the owner's pages, those given back and not seen mapped since
    /// (absent, so neither in `pages_merged` nor in `zero_pages`); `None`
    /// from a backend that does not follow its pages (kernel KSM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages_returned: Option<u64>,
}

/// Counts split by the rule that let a page merge (`region::Origin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByOrigin {
    /// Unchanged since its previous visit a pass earlier (KSM's rule), by
    /// its hash or by the write log.
    pub steady: u64,
    /// Changed at its visit, then unwritten for a whole write-log interval
    /// (the write log's second look).
    pub second_look: u64,
    /// At first sight, with no check that it stays unchanged: a join of an
    /// existing slot, a run of one pattern, a run continued unhashed.
    pub first_sight: u64,
    /// Filled by a device just before (I/O hints).
    pub hinted: u64,
}

impl ByOrigin {
    /// The count of the origin with index `i` (`region::Origin::index`).
    pub fn at_mut(&mut self, i: usize) -> &mut u64 {
        match i {
            0 => &mut self.steady,
            1 => &mut self.second_look,
            2 => &mut self.first_sight,
            _ => &mut self.hinted,
        }
    }

    /// The sum over origins.
    pub fn total(&self) -> u64 {
        self.steady + self.second_look + self.first_sight + self.hinted
    }

    /// Each count minus `base`'s (counts since `base` was taken).
    pub fn since(&self, base: &ByOrigin) -> ByOrigin {
        ByOrigin {
            steady: self.steady.saturating_sub(base.steady),
            second_look: self.second_look.saturating_sub(base.second_look),
            first_sight: self.first_sight.saturating_sub(base.first_sight),
            hinted: self.hinted.saturating_sub(base.hinted),
        }
    }
}

/// pagefold's merges and the copy-on-write breaks that undid them, by
/// the rule that let each page merge: which rules merge pages the guests
/// write again soon. Zero drops count as merges, their refills as breaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeOrigins {
    /// Merges since the start (their sum is `Stats::merges`).
    pub merges: ByOrigin,
    /// Copy-on-write breaks since the start, by the origin of the merge
    /// they undid (their sum is `Stats::cow_breaks`).
    pub cow_breaks: ByOrigin,
    /// Of `merges`, drops to the zero page.
    pub zero_merges: u64,
    /// Of `cow_breaks`, zero-dropped pages written again.
    pub zero_refills: u64,
}

impl MergeOrigins {
    /// The counts since `base` was taken.
    pub fn since(&self, base: &MergeOrigins) -> MergeOrigins {
        MergeOrigins {
            merges: self.merges.since(&base.merges),
            cow_breaks: self.cow_breaks.since(&base.cow_breaks),
            zero_merges: self.zero_merges.saturating_sub(base.zero_merges),
            zero_refills: self.zero_refills.saturating_sub(base.zero_refills),
        }
    }
}

/// Backend statistics: KSM-compatible names, plus pagefold's own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// `pagefold` or `ksm`.
    pub backend: String,
    /// The mode in force.
    pub mode: Mode,
    /// The knobs in force (None from a backend that has not reported).
    pub knobs: Option<Knobs>,
    /// Shared pages in use (pool pages mapped at least twice / KSM pages).
    pub pages_shared: u64,
    /// How many more sites are sharing them (saving, in pages).
    pub pages_sharing: u64,
    /// Pages scanned, stable since their last visit, with no partner.
    pub pages_unshared: u64,
    /// Pages whose content changed since their last visit.
    pub pages_volatile: u64,
    /// Pages dropped to the kernel's zero page.
    pub zero_pages: u64,
    /// Full passes over every registered region.
    pub full_scans: u64,
    /// Pages merged (zero drops included) since the backend started.
    pub merges: u64,
    /// Longest park of the guests for a merge batch, in microseconds (0:
    /// none); `None` from a backend that never parks them (kernel KSM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_guest_pause_us: Option<u64>,
    /// Guest or device writes that waited for a merge in flight to end,
    /// counted once per merge window they waited on: a writer so waits in
    /// the kernel and its vCPU takes no interrupt meanwhile. `None` from a
    /// backend whose merges no write waits on (kernel KSM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_waits: Option<u64>,
    /// Those waits in all, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_wait_us: Option<u64>,
    /// The longest of them, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_write_wait_us: Option<u64>,
    /// Merged pages a write took back (copy on write) since the start.
    /// Kernel KSM counts these host-wide only (`cow_ksm` of
    /// `/proc/vmstat`): its figure includes other KSM users'.
    pub cow_breaks: u64,
    /// Pool pages in use (pagefold).
    pub pool_pages: u64,
    /// VMAs the merges made in guest RAM (pagefold).
    pub vmas_created: u64,
    /// VMAs the process may still create under `vm.max_map_count`.
    pub map_count_headroom: u64,
    /// Merges were refused for lack of VMAs.
    pub map_count_limited: bool,
    /// CPU time of the merging side: the engine's threads, or ksmd's.
    pub cpu_seconds: f64,
    /// (`pages_sharing` + `zero_pages`) x the page size.
    pub bytes_saved: u64,
    /// Heap bytes of the backend's bookkeeping.
    pub metadata_bytes: u64,
    /// Saved minus engine metadata and kernel VMA overhead (may be negative).
    pub profit_bytes: i64,
    /// Milliseconds since the scanner last started a wake-up (0 when the
    /// backend does not know, or has not woken yet).
    #[serde(default)]
    pub last_wakeup_age_ms: u64,
    /// The backend's own watchdog: scanning is on but no wake-up started
    /// within the planned sleep plus a grace period (a stalled engine).
    #[serde(default)]
    pub wakeup_overdue: bool,
    /// pagefold's KSM assist: off, standby, engaged (group), unavailable
    /// (why). Empty for backends without one.
    #[serde(default)]
    pub ksm_assist: String,
    /// Of `pages_sharing`, pages shared by kernel KSM (assist).
    #[serde(default)]
    pub ksm_pages_sharing: u64,
    /// Of `cpu_seconds`, ksmd's CPU while it assisted.
    #[serde(default)]
    pub ksm_cpu_seconds: f64,
    /// I/O hints received (device-filled ranges).
    #[serde(default)]
    pub hints: u64,
    /// I/O hints dropped because their queue was full.
    #[serde(default)]
    pub hints_dropped: u64,
    /// Merges made while visiting hinted pages.
    #[serde(default)]
    pub hint_merges: u64,
    /// Their mean delay from the hint (the device fill) to the merge, in
    /// milliseconds.
    #[serde(default)]
    pub hint_merge_delay_ms: f64,
    /// Regions whose guest writes the engine reads from a write log (KVM's
    /// dirty log).
    #[serde(default)]
    pub write_logged_regions: u64,
    /// Due visits the write log answered without a pagemap read or a hash.
    #[serde(default)]
    pub clean_visits: u64,
    /// Transparent huge pages of guest RAM the engine split before merging
    /// part of one, so that the merged part is freed at once.
    #[serde(default)]
    pub huge_pages_split: u64,
    /// pagefold's merges and copy-on-write breaks by the rule that let
    /// each page merge (zero from the KSM backend, which cannot tell).
    #[serde(default)]
    pub origins: MergeOrigins,
    /// How long pages must stay unchanged before the scan merges them, in
    /// milliseconds (0: one pass, however short): follows how many of its
    /// merges the guests undo (pagefold).
    #[serde(default)]
    pub settle_ms: u64,
    /// Settling on or off (`DedupSettings::settle`): while off,
    /// `settle_ms` stays 0. `None` from a backend with no settle time
    /// (kernel KSM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<bool>,
    /// Of `cpu_seconds`, the scanner's time executing merges and zero
    /// drops (protect, final compare, remap, unprotect), apart from
    /// finding them (pagefold).
    #[serde(default)]
    pub merge_cpu_seconds: f64,
    /// Pages given back through [`DedupBackend::discard`] since the
    /// start, every owner's (the sum of `OwnerStats::pages_reported` over
    /// the owners still registered, plus those of owners gone).
    #[serde(default)]
    pub pages_reported: u64,
    /// Pages given back and not seen mapped since, over the registered
    /// regions (`None`: the backend does not follow them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages_returned: Option<u64>,
    /// The figures of each owner (VM).
    pub per_owner: BTreeMap<String, OwnerStats>,
}

/// What the VMM needs from a dedup backend.
pub trait DedupBackend: Send + Sync {
    /// Short name: `pagefold` or `ksm`.
    fn name(&self) -> &'static str;

    /// Offers a region for deduplication.
    ///
    /// # Safety
    /// `spec.host_addr..+len` must be a private anonymous mapping of this
    /// process that stays mapped until [`DedupBackend::unregister`] for the
    /// returned id has returned.
    unsafe fn register(&self, spec: RegionSpec) -> Result<RegionId>;

    /// Withdraws a region. When it returns, the backend no longer touches the
    /// memory (no merge in flight, no waiter left blocked).
    fn unregister(&self, id: RegionId) -> Result<()>;

    /// Withdraws a region that the caller unmaps right afterwards (VM
    /// teardown). A backend may then skip giving merged pages private copies
    /// back, and may replace the region's mappings with fresh anonymous
    /// memory of the same range (pagefold's engine does, to drop a VMA per
    /// scattered merge in one unmap). The default is
    /// [`DedupBackend::unregister`].
    ///
    /// # Safety
    /// The caller must unmap the region right after this returns and never
    /// read or write it again.
    unsafe fn unregister_unmapping(&self, id: RegionId) -> Result<()> {
        self.unregister(id)
    }

    /// I/O hint: a device just filled `host_addr..+len` (e.g. a virtio-blk
    /// read into the guest's page cache). Two VMs reading one image fill
    /// identical pages; a backend may visit them first. Cheap and
    /// non-blocking; the default ignores it (kernel KSM cannot use it).
    fn hint(&self, _host_addr: usize, _len: usize) {}

    /// A device wrote `host_addr..+len` with content no other VM is
    /// likely to share (a received network frame): the write log must
    /// know (KVM's dirty log sees only the guest's own writes), but the
    /// pages are no merge candidates. A backend marks them written, so
    /// the scan hashes them again and waits for them to settle as it does
    /// for pages the guest writes. Cheap and non-blocking; the default
    /// ignores it (kernel KSM compares pages itself).
    fn device_wrote(&self, _host_addr: usize, _len: usize) {}

    /// Gives `host_addr..+len` (page aligned, inside one registered
    /// region) back to the host: the owner no longer needs the content (a
    /// balloon's inflated page, a range free page reporting reported), so
    /// its memory is freed and the range reads zeros afterwards. Returns
    /// the pages given back: a page the backend could not give back (the
    /// engine's VMA budget spent) keeps its mapping and content. A page
    /// merged onto a shared page is unmapped from it without a copy; a
    /// page the backend tracks is not scanned again until it is written.
    ///
    /// # Safety
    /// Nothing in the process relies on the range's content any more: it
    /// becomes zeros under any reader. (The guest's own later writes to it
    /// are fine: they land on fresh memory.)
    unsafe fn discard(&self, host_addr: usize, len: usize) -> Result<u64>;

    /// [`DedupBackend::discard`] of each range of `ranges` (`(host_addr,
    /// len)`), in one step where the backend can (the engine takes its
    /// core once: a balloon's inflation gives back pages one by one).
    /// Stops at the first error; returns the pages given back.
    ///
    /// # Safety
    /// As [`DedupBackend::discard`], for every range.
    unsafe fn discard_ranges(&self, ranges: &[(usize, usize)]) -> Result<u64> {
        let mut n = 0;
        for &(a, l) in ranges {
            // SAFETY: forwarded from this function's contract.
            n += unsafe { self.discard(a, l) }?;
        }
        Ok(n)
    }

    /// Gives the backend a way to park the threads that run guest code in
    /// region `id` around a batch of merges (`None` takes it back; the VMM
    /// does so before those threads are joined). See [`crate::Quiesce`].
    /// The default ignores it (kernel KSM's flushes are its own).
    fn set_quiesce(&self, _id: RegionId, _q: Option<std::sync::Arc<dyn crate::quiesce::Quiesce>>) {}

    /// Takes back the vCPU holds and write logs of regions `ids` (a VM
    /// stopping, before its vCPU threads are joined): what
    /// [`DedupBackend::set_quiesce`] and [`DedupBackend::set_write_log`]
    /// with `None` do for each, which a backend may do in one step (the
    /// engine takes its core once instead of twice per region: a deletion
    /// waits for the scan each time).
    fn detach_guest(&self, ids: &[RegionId]) {
        for &id in ids {
            self.set_quiesce(id, None);
            self.set_write_log(id, None);
        }
    }

    /// Does this backend use write logs ([`DedupBackend::set_write_log`])?
    /// A VMM turns its dirty log on only for backends that read it (the
    /// log costs the guest a write fault per page per collection).
    fn wants_write_log(&self) -> bool {
        false
    }

    /// Gives the backend region `id`'s write log: the pages the guest wrote
    /// since the previous collection (`None` takes it back; the VMM does so
    /// before the VM goes). See [`crate::WriteLog`]. The default ignores it.
    fn set_write_log(
        &self,
        _id: RegionId,
        _log: Option<std::sync::Arc<dyn crate::writelog::WriteLog>>,
    ) {
    }

    /// Applies checked settings: the knobs given, then the mode, if given
    /// (a bad knob never leaves the mode changed). Returns the knobs now
    /// in force. Auto-mode settings are the auto controller's (see
    /// `auto::AutoHandle`); backends ignore them here. A backend takes
    /// the settings of another backend (kernel KSM: `max_guest_pause_us`,
    /// `settle`) and ignores them too, so that one config or request
    /// serves either backend.
    fn apply(&self, settings: &CheckedSettings) -> Result<Knobs>;

    /// Changes the mode alone.
    fn set_mode(&self, mode: Mode) -> Result<()> {
        self.apply(&mode.into()).map(drop)
    }

    /// The mode in force.
    fn mode(&self) -> Mode;
    /// The knobs in force.
    fn knobs(&self) -> Knobs;
    /// The current figures (never waits for a scan in progress).
    fn stats(&self) -> Stats;

    /// Stops the backend's threads (merged pages stay valid) and restores any
    /// global state it changed. Idempotent.
    fn shutdown(&self);
}
