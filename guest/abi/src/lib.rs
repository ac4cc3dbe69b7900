//! The contract between pagefold and its workload guest: guest memory layout,
//! the workload control device's ports and mailbox protocol, the parameter
//! block, and the deterministic page generator. `no_std`, no dependencies: it
//! is compiled into the freestanding guest and into the host.
#![no_std]

pub mod build;
pub mod classes;
pub mod disk;
#[cfg(any(test, feature = "std"))]
pub mod expect;
pub mod generator;
pub mod mailbox;
pub mod merge_probe;
pub mod pause;
pub mod placement;
pub mod virtio;

pub use placement::Placement;

/// Guest page size.
pub const PAGE_SIZE: u64 = 4096;

/// Guest-physical layout of a workload VM (identity mapped, GPA == VA).
pub mod layout {
    /// GDT (code/data descriptors for CPL0 and CPL3, a TSS descriptor).
    pub const GDT_ADDR: u64 = 0x1000;
    /// First page-table page (PML4), then PDPT, then one PD per GiB.
    pub const PAGE_TABLES_START: u64 = 0x10000;
    /// End of the page-table area (exclusive): room for 110 GiB of 2 MiB mappings.
    pub const PAGE_TABLES_END: u64 = 0x80000;
    /// Initial stack pointer (the stack grows down towards PAGE_TABLES_END).
    pub const STACK_TOP: u64 = 0x100000;
    /// Where the workload ELF is linked and loaded.
    pub const IMAGE_BASE: u64 = 0x200000;
}

/// Port-I/O registers of the workload control device (32-bit accesses).
pub mod ports {
    /// Base of the device's port range.
    pub const BASE: u16 = 0x500;
    /// Number of ports the device decodes.
    pub const LEN: u16 = 0x10;
    /// out: run operation `value` on the registered mailbox.
    pub const DOORBELL: u16 = BASE;
    /// out: low 32 bits of the mailbox's guest-physical address.
    pub const MAILBOX_LO: u16 = BASE + 4;
    /// out: high 32 bits of the mailbox's guest-physical address.
    pub const MAILBOX_HI: u16 = BASE + 8;
    /// in: status of the last operation (0 = ok).
    pub const STATUS: u16 = BASE + 12;
}

/// Magic value of [`WorkloadParams::magic`]. The low byte is the layout
/// version of [`WorkloadParams`] (2: the disk fields at the end; 3: the
/// placement fields after them), so a guest and a host built from different
/// layouts refuse each other's parameters instead of misreading them.
pub const PARAMS_MAGIC: u64 = 0x7061_6765_666f_6c03;

/// Phase opcodes of [`WorkloadParams::program`].
pub mod phase {
    /// End of program.
    pub const END: u32 = 0;
    /// Write every page (shared, private, zero and duplicate pages).
    pub const FILL: u32 = 1;
    /// Rewrite private pages (see the churn_* parameters).
    pub const CHURN: u32 = 2;
    /// Check every page against what the guest wrote.
    pub const VERIFY: u32 = 3;
    /// Sleep for `program_args[i]` milliseconds (the host blocks the vCPU).
    pub const SLEEP: u32 = 4;
    /// Block until the host releases the gate, at most `program_args[i]` ms.
    pub const WAIT_HOST: u32 = 5;
    /// Rewrite every page with its current content generator (bandwidth of
    /// writes to already-touched pages).
    pub const REWRITE: u32 = 6;
    /// Fault injection for tests: execute `ud2`. The guest has no IDT, so
    /// this is a triple fault, which the VMM must report as a guest error of
    /// this VM alone.
    pub const FAULT: u32 = 7;
    /// Fault injection for tests: write to an I/O port no device decodes
    /// (`BAD_PORT`).
    pub const BAD_PORT_WRITE: u32 = 8;
    /// Read pages of disk 0 through virtio-blk into the disk area of the
    /// data area (a "page cache", see [`crate::disk`]): disk page `k` goes to
    /// `DataLayout::disk_page_gpa(k)`. Checksums every page, and with
    /// `disk_seed != 0` checks each against the test-image generator
    /// (mismatches count like VERIFY's). Arg: pages to read from the start of
    /// the disk (0: `disk_pages`).
    pub const DISK_READ: u32 = 9;
    /// The modelled build ([`crate::build`]): reads the source tree on
    /// disk 0 into the page cache, compiles every file, links the objects.
    /// Uses the whole disk area as its build area, which follows the VM's
    /// placement. Arg: 0 in a linear VM, scatter the area's pages anyway
    /// (keyed by `private_seed`); 1 keep the VM's placement as it is.
    pub const BUILD: u32 = 10;
    /// The pause probe ([`crate::pause`]): loop on the TSC for
    /// `program_args[i]` ms and count every gap between two reads above
    /// `pause::GAP_THRESHOLD_NS` (the vCPU was stopped: a VM exit, a park,
    /// a host preemption, a fault). Reports `PhaseReport::pauses` and the
    /// mailbox's histogram.
    pub const LATENCY: u32 = 11;
    /// LATENCY, and every `pause::WRITE_INTERVAL_US` rewrite one page of
    /// the shared set with its current content (a COW break where it is
    /// merged), the write's time inside the measured gap.
    pub const LATENCY_WRITE: u32 = 12;
    /// The write-timing side channel ([`crate::merge_probe`]): sleep
    /// `program_args[i]` ms (0: none; a host gate before it may wait
    /// instead), then write each probe page once in random order, time
    /// each write with the TSC, learn a threshold from half of the pages'
    /// known labels and classify the other half. Probe pages: the logical
    /// pages, labelled shared when another VM of the same seed holds them
    /// (the shared region), when all zero, or when an in-VM duplicate;
    /// unique otherwise (private unique pages); at most
    /// `merge_probe::MAX_PROBES / 2` of each label, as many of each.
    /// Writes each page's first word with the value it holds: contents and
    /// versions stay as they were; right after each write, times a read of
    /// another cache line of the page. Reports `PhaseReport::probe`.
    pub const PROBE_MERGE: u32 = 13;
    /// Highest valid opcode.
    pub const LAST: u32 = PROBE_MERGE;
    /// The port BAD_PORT_WRITE pokes.
    pub const BAD_PORT: u16 = 0x1234;

    /// Lower-case name of a phase opcode (for logs and reports).
    pub const fn name(op: u32) -> &'static str {
        match op {
            END => "end",
            FILL => "fill",
            CHURN => "churn",
            VERIFY => "verify",
            SLEEP => "sleep",
            WAIT_HOST => "wait-host",
            REWRITE => "rewrite",
            FAULT => "fault",
            BAD_PORT_WRITE => "badport",
            DISK_READ => "disk-read",
            BUILD => "build",
            LATENCY => "latency",
            LATENCY_WRITE => "latency-write",
            PROBE_MERGE => "probe-merge",
            _ => "unknown",
        }
    }
}

/// Parameters the guest fetches at start-up. All fields are plain integers so
/// that the struct has the same layout in guest and host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadParams {
    pub magic: u64,
    /// Index of the VM in its process (informational).
    pub vm_index: u64,
    /// Seed of the shared, read-mostly part: same seed => identical pages.
    pub seed: u64,
    /// Seed of the private part (differs per VM).
    pub private_seed: u64,
    /// Pages of shared content (like a page cache of the same files).
    pub shared_pages: u64,
    /// Pages of private content (changing memory; the churn phase rewrites these).
    pub private_pages: u64,
    /// Of all pages, this many per mille are all-zero.
    pub zero_permille: u32,
    /// Of all pages, this many per mille duplicate another page of this guest.
    pub dup_permille: u32,
    /// Fraction (per mille) of private pages the churn phase rewrites.
    pub churn_permille: u32,
    /// Churn rate in pages per second (0: as fast as possible).
    pub churn_rate: u32,
    /// Churn duration in milliseconds.
    pub churn_ms: u64,
    /// TSC frequency, for the guest's own clock (rdtsc).
    pub tsc_khz: u64,
    /// Usable RAM for workload data: [data_start, data_end) and, when RAM
    /// extends above the MMIO hole, [high_start, high_end) (else both 0).
    pub data_start: u64,
    pub data_end: u64,
    pub high_start: u64,
    pub high_end: u64,
    /// Phase program (opcodes from [`phase`]), ended by `phase::END`.
    pub program: [u32; 16],
    /// One argument per program slot: SLEEP: ms; WAIT_HOST: max ms (0: no
    /// limit); CHURN: duration ms (0: `churn_ms`); DISK_READ: pages (0:
    /// `disk_pages`); LATENCY, LATENCY_WRITE: duration ms; PROBE_MERGE:
    /// ms to sleep before writing; others: unused.
    pub program_args: [u64; 16],
    // Layout version 2 (the fields below are new; older fields keep their
    // offsets).
    /// Number of virtio-blk disks (at most [`disk::MAX_DISKS`]).
    pub disk_count: u64,
    /// Guest-physical base of each disk's virtio-mmio register window
    /// (identity-mapped by the VMM; entries past `disk_count` are 0).
    pub disk_mmio: [u64; disk::MAX_DISKS],
    /// Pages of the data area reserved for disk reads (after the logical
    /// pages; see `classes::DataLayout::disk_page_gpa`).
    pub disk_pages: u64,
    /// Non-zero: disk 0 is a test image made with this seed
    /// ([`disk::image_page_base`]), and DISK_READ checks every page against
    /// it. Zero: the content is unknown; DISK_READ only checksums it.
    pub disk_seed: u64,
    // Layout version 3 (appended; older fields keep their offsets).
    /// Placement of the data area (`placement::code`: 0 linear, 1
    /// scattered; see [`Placement`]). All three fields 0: linear, the layout
    /// of version 2.
    pub placement: u32,
    /// Scattered: items per extent (`1..=placement::MAX_EXTENT_PAGES`).
    /// Linear: 0.
    pub extent_pages: u32,
    /// Scattered: seed of the VM's permutation. Linear: 0.
    pub placement_seed: u64,
}

impl WorkloadParams {
    /// All fields zero (const, for the guest's `.bss` mailbox).
    pub const ZERO: Self = Self {
        magic: 0,
        vm_index: 0,
        seed: 0,
        private_seed: 0,
        shared_pages: 0,
        private_pages: 0,
        zero_permille: 0,
        dup_permille: 0,
        churn_permille: 0,
        churn_rate: 0,
        churn_ms: 0,
        tsc_khz: 0,
        data_start: 0,
        data_end: 0,
        high_start: 0,
        high_end: 0,
        program: [0; 16],
        program_args: [0; 16],
        disk_count: 0,
        disk_mmio: [0; disk::MAX_DISKS],
        disk_pages: 0,
        disk_seed: 0,
        placement: 0,
        extent_pages: 0,
        placement_seed: 0,
    };

    /// Logical pages the workload holds (shared + private; saturating, so
    /// that parameters whose sum overflows fail `DataLayout::new` as too
    /// many pages instead of panicking).
    pub const fn total_pages(&self) -> u64 {
        self.shared_pages.saturating_add(self.private_pages)
    }

    /// The program's (slot, opcode, arg) up to the first `phase::END`.
    pub fn phases(&self) -> impl Iterator<Item = (usize, u32, u64)> + '_ {
        self.program
            .iter()
            .zip(self.program_args.iter())
            .enumerate()
            .map(|(slot, (&op, &arg))| (slot, op, arg))
            .take_while(|&(_, op, _)| op != phase::END)
    }

    /// Pages the program's DISK_READ phases fill, from the start of the disk
    /// area: the largest of their page counts (0 if there is none). A BUILD
    /// phase uses the whole disk area.
    pub fn disk_read_pages(&self) -> u64 {
        self.phases()
            .filter(|&(_, op, _)| op == phase::DISK_READ || op == phase::BUILD)
            .map(|(_, op, arg)| {
                if arg == 0 || op == phase::BUILD {
                    self.disk_pages
                } else {
                    arg
                }
            })
            .max()
            .unwrap_or(0)
    }
}
