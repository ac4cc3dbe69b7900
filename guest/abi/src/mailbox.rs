//! The mailbox protocol of the workload control device.
//!
//! The guest registers one [`Mailbox`] (in its own RAM, 8-byte aligned) by
//! writing its guest-physical address to `ports::MAILBOX_LO` then
//! `ports::MAILBOX_HI`, fills the fields an operation uses, and writes the
//! opcode ([`op`]) to `ports::DOORBELL`. The `out` exits to the VMM, which
//! reads/writes the mailbox in guest memory and completes the operation
//! before the guest runs again (SLEEP and WAIT_HOST block the vCPU there).
//! Reading `ports::STATUS` then gives the result ([`status`]).
//! A fixed layout (no per-op variants) keeps both sides trivial: the host
//! touches only the fields of the operation at hand.

use crate::merge_probe::MergeProbe;
use crate::pause::{PauseHistogram, PauseSummary};
use crate::WorkloadParams;

/// Operations (values written to `ports::DOORBELL`).
pub mod op {
    /// Host writes the parameters into `Mailbox::params`.
    pub const GET_PARAMS: u32 = 1;
    /// The guest started and accepted its parameters. `args[0]`: ABI version.
    pub const HELLO: u32 = 2;
    /// A phase starts. `args`: [opcode, program slot, program arg].
    pub const PHASE_BEGIN: u32 = 3;
    /// The current phase ended; `Mailbox::report` holds its report.
    pub const PHASE_END: u32 = 4;
    /// Progress of a long phase. `args`: [opcode, pages done, pages total].
    pub const PROGRESS: u32 = 5;
    /// A log line: `Mailbox::log[..log_len]` (UTF-8, lossy on the host).
    pub const LOG: u32 = 6;
    /// Block the vCPU for `args[0]` ms (the guest has no `hlt` at CPL3).
    pub const SLEEP: u32 = 7;
    /// Block until the host releases the next gate, at most `args[0]` ms
    /// (0: no limit). Status `TIMED_OUT` if the limit passed first.
    pub const WAIT_HOST: u32 = 8;
    /// The guest is done; `args[0]` is its exit code ([`super::exit_code`]).
    pub const EXIT: u32 = 9;
    /// Host writes its monotonic clock (ns since the device was made) to
    /// `args[0]` (a fallback clock when `tsc_khz` is 0).
    pub const CLOCK: u32 = 10;
}

/// Values read from `ports::STATUS` after an operation.
pub mod status {
    /// Done.
    pub const OK: u32 = 0;
    /// WAIT_HOST: the time limit passed before the host released the gate.
    pub const TIMED_OUT: u32 = 1;
    /// The host is shutting the VM down: end the program and EXIT now.
    pub const STOPPED: u32 = 2;
    /// The operation failed (the host also reports an error for the VM).
    pub const ERROR: u32 = 0xffff_ffff;
}

/// Exit codes of the EXIT operation.
pub mod exit_code {
    /// Every phase ran and VERIFY found no mismatch.
    pub const OK: u32 = 0;
    /// VERIFY found mismatching pages.
    pub const MISMATCH: u32 = 1;
    /// The host stopped the guest (status STOPPED).
    pub const STOPPED: u32 = 2;
    /// The parameters were rejected (bad magic, layout, opcode).
    pub const BAD_PARAMS: u32 = 3;
    /// The guest panicked (a LOG with the location precedes the EXIT).
    pub const PANIC: u32 = 4;
    /// A DISK_READ could not use its disk: no virtio-blk device at the
    /// address, a refused feature set or queue, an I/O error status, or no
    /// completion in time (a LOG with the reason precedes the EXIT).
    pub const DISK_ERROR: u32 = 5;
}

/// Mailbox protocol version, sent with HELLO (2: `PhaseReport::checksum`,
/// the disk fields of `WorkloadParams`; 3: its placement fields; 4: the
/// BUILD fields at the end of `PhaseReport`; 5: `PhaseReport::pauses` and
/// `Mailbox::pauses`, the LATENCY phases; 6: `PhaseReport::probe`, the
/// PROBE_MERGE phase).
pub const ABI_VERSION: u64 = 6;

/// The guest sends PROGRESS every this many pages of a long phase (256 MiB);
/// its status is also how a host stop reaches a running phase.
pub const PROGRESS_PAGES: u64 = 65536;

/// Bytes of log text per LOG operation.
pub const LOG_CAPACITY: usize = 200;

/// Sent with PHASE_END. Counts are pages of 4 KiB unless named otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseReport {
    /// Phase opcode (`phase::*`).
    pub phase: u32,
    /// Program slot.
    pub slot: u32,
    /// Pages written (FILL, CHURN, REWRITE) or checked (VERIFY).
    pub pages: u64,
    /// Bytes written or checked.
    pub bytes: u64,
    /// Of `pages`, zero-class pages.
    pub zero_pages: u64,
    /// Of `pages`, duplicate-class pages.
    pub dup_pages: u64,
    /// VERIFY: pages whose content differs from what the guest wrote.
    pub mismatches: u64,
    /// VERIFY: logical index of the first mismatching page (`u64::MAX`: none).
    pub first_mismatch: u64,
    /// VERIFY: word index (0..512) of the first difference in that page.
    pub mismatch_word: u64,
    /// VERIFY: expected and found value of that word.
    pub expected_word: u64,
    pub found_word: u64,
    /// CHURN: total churn writes since the last FILL (all CHURN phases), the
    /// input of `classes::version_after_churn`.
    pub churn_writes_total: u64,
    /// Guest-measured duration in TSC cycles (the host's time is authoritative).
    pub tsc_cycles: u64,
    /// DISK_READ: checksum of the pages read (`disk::checksum_step` over
    /// `disk::page_digest` of each page in disk order): equal checksums mean
    /// two guests hold the same page-cache pages.
    pub checksum: u64,
    // ABI version 3.
    /// BUILD: pages written (heap pages taken, object and output pages).
    pub pages_written: u64,
    /// BUILD: heap pages taken from the free list that an earlier compile
    /// job had written (a merged one is COW-broken by the rewrite).
    pub pages_reused: u64,
    /// BUILD: guest-measured microseconds of the CPU-bound part (compile
    /// and link, without the disk reads).
    pub cpu_us: u64,
    // ABI version 5.
    /// LATENCY, LATENCY_WRITE: gaps, stopped time, run time and the longest
    /// gap; the histogram of the gaps is `Mailbox::pauses`.
    pub pauses: PauseSummary,
    // ABI version 6.
    /// PROBE_MERGE: the timed writes' classification and class quantiles.
    pub probe: MergeProbe,
}

/// Value of [`PhaseReport::first_mismatch`] when nothing mismatched.
pub const NO_MISMATCH: u64 = u64::MAX;

/// The mailbox the guest registers.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mailbox {
    /// Operation arguments (see [`op`]).
    pub args: [u64; 4],
    /// PHASE_END's report.
    pub report: PhaseReport,
    /// Written by the host on GET_PARAMS.
    pub params: WorkloadParams,
    /// Length of the LOG text in `log`.
    pub log_len: u64,
    pub log: [u8; LOG_CAPACITY],
    /// PHASE_END of a LATENCY phase: the histogram of its gaps (read by the
    /// host only for those phases).
    pub pauses: PauseHistogram,
}

impl Mailbox {
    /// An all-zero mailbox (const, so the guest can keep it in `.bss`).
    pub const ZERO: Self = Self {
        args: [0; 4],
        report: PhaseReport {
            phase: 0,
            slot: 0,
            pages: 0,
            bytes: 0,
            zero_pages: 0,
            dup_pages: 0,
            mismatches: 0,
            first_mismatch: 0,
            mismatch_word: 0,
            expected_word: 0,
            found_word: 0,
            churn_writes_total: 0,
            tsc_cycles: 0,
            checksum: 0,
            pages_written: 0,
            pages_reused: 0,
            cpu_us: 0,
            pauses: PauseSummary {
                gaps: 0,
                stopped_ns: 0,
                run_ns: 0,
                max_gap_ns: 0,
            },
            probe: MergeProbe {
                pages: 0,
                shared_pages: 0,
                train_pages: 0,
                tested: 0,
                correct: 0,
                threshold_cycles: 0,
                tsc_khz: 0,
                shared_cycles: [0; 7],
                unique_cycles: [0; 7],
                read_correct: 0,
                shared_read_cycles: 0,
                unique_read_cycles: 0,
            },
        },
        params: WorkloadParams::ZERO,
        log_len: 0,
        log: [0; LOG_CAPACITY],
        pauses: PauseHistogram::ZERO,
    };
}

/// Byte offsets of the mailbox fields (what the host reads and writes).
pub mod offset {
    use super::Mailbox;
    pub const ARGS: usize = core::mem::offset_of!(Mailbox, args);
    pub const REPORT: usize = core::mem::offset_of!(Mailbox, report);
    pub const PARAMS: usize = core::mem::offset_of!(Mailbox, params);
    pub const LOG_LEN: usize = core::mem::offset_of!(Mailbox, log_len);
    pub const LOG: usize = core::mem::offset_of!(Mailbox, log);
    pub const PAUSES: usize = core::mem::offset_of!(Mailbox, pauses);
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layout_is_fixed_and_padding_free() {
        // The host and the guest are separate builds: pin the layout.
        assert_eq!(
            size_of::<PhaseReport>(),
            8 + 15 * 8 + 4 * 8 + 7 * 8 + 14 * 8 + 3 * 8
        );
        assert_eq!(
            size_of::<WorkloadParams>(),
            14 * 8 + 16 * 4 + 16 * 8 + (3 + crate::disk::MAX_DISKS) * 8 + 4 + 4 + 8
        );
        // Layout version 2 appended the disk fields; version-1 fields keep
        // their offsets.
        assert_eq!(
            core::mem::offset_of!(WorkloadParams, disk_count),
            14 * 8 + 16 * 4 + 16 * 8
        );
        // Layout version 3 appended the placement fields after them.
        assert_eq!(
            core::mem::offset_of!(WorkloadParams, placement),
            14 * 8 + 16 * 4 + 16 * 8 + (3 + crate::disk::MAX_DISKS) * 8
        );
        assert_eq!(offset::ARGS, 0);
        assert_eq!(offset::REPORT, 32);
        assert_eq!(offset::PARAMS, 32 + size_of::<PhaseReport>());
        assert_eq!(
            offset::LOG_LEN,
            offset::PARAMS + size_of::<WorkloadParams>()
        );
        assert_eq!(offset::LOG, offset::LOG_LEN + 8);
        assert_eq!(offset::PAUSES, offset::LOG + LOG_CAPACITY);
        assert_eq!(
            size_of::<Mailbox>(),
            offset::PAUSES + 4 * crate::pause::BUCKETS
        );
        assert_eq!(align_of::<Mailbox>(), 8);
        assert!(size_of::<Mailbox>() < 4096);
    }

    #[test]
    fn zero_mailbox_is_all_zero() {
        let m = Mailbox::ZERO;
        assert_eq!(m.params, WorkloadParams::default());
        assert_eq!(m.report, PhaseReport::default());
        assert!(m.log.iter().all(|&b| b == 0));
        assert_eq!(m.pauses, PauseHistogram::default());
    }
}
