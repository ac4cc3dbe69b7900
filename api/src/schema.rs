//! Schema-only types: how the OpenAPI spec describes JSON whose Rust type
//! lives in a crate without utoipa (the VMM's `VmConfig` and `VmInfo`; the
//! dedup settings types derive their schemas behind pagefold-dedup's
//! `utoipa` feature). These types never carry data; tests keep each in step
//! with the real type (same fields, real values validate).

#![allow(dead_code)]

use utoipa::ToSchema;

/// 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-', starting with a letter
/// or digit (so never `.`, `..` or `-x`).
#[derive(ToSchema)]
#[schema(as = VmName, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
pub struct VmNameSchema(String);

/// `stopped`: the VM finished (its outcome says how); it stays listed until
/// deleted.
#[derive(ToSchema)]
#[schema(as = RunState)]
#[serde(rename_all = "lowercase")]
pub enum RunStateSchema {
    Running,
    Paused,
    Stopping,
    Stopped,
}

#[derive(ToSchema)]
#[schema(as = OutcomeKind)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKindSchema {
    GuestExit,
    GuestReset,
    GuestPowerOff,
    GuestError,
    VmmError,
    Stopped,
    Deleted,
}

/// Why a VM stopped (set once it is stopping): `kind`, plus `status`
/// (guest_exit), `message` (guest_error, vmm_error) or `reason` (stopped).
#[derive(ToSchema)]
#[schema(as = Outcome)]
pub struct OutcomeSchema {
    kind: OutcomeKindSchema,
    #[schema(nullable = false)]
    status: Option<u32>,
    #[schema(nullable = false)]
    message: Option<String>,
    #[schema(nullable = false)]
    reason: Option<String>,
}

/// A VM as the API shows it.
#[derive(ToSchema)]
#[schema(as = VmInfo)]
#[serde(deny_unknown_fields)]
pub struct VmInfoSchema {
    name: String,
    state: RunStateSchema,
    #[schema(minimum = 1, maximum = 255)]
    vcpus: u8,
    memory_bytes: u64,
    /// The VM's dedup group; null when its RAM is not offered for dedup.
    #[schema(required = true)]
    dedup_group: Option<String>,
    #[schema(required = true)]
    outcome: Option<OutcomeSchema>,
    #[schema(minimum = 0)]
    uptime_s: f64,
    guest_pauses: GuestPausesSchema,
    /// The VM's balloon; absent for a VM without one.
    #[schema(nullable = false)]
    balloon: Option<BalloonStatusSchema>,
    /// The VM's NICs in config order; absent for a VM without one.
    #[schema(nullable = false)]
    nics: Option<Vec<NicStatusSchema>>,
}

/// A NIC's figures since the VM started (frames and bytes include the
/// 12-byte vnet header), and its queues' indices: what shows where a
/// stalled transfer stopped.
#[derive(ToSchema)]
#[schema(as = NicStatus)]
#[serde(deny_unknown_fields)]
pub struct NicStatusSchema {
    /// The host tap it sends and receives on.
    tap: String,
    mac: String,
    #[schema(minimum = 0)]
    rx_frames: u64,
    #[schema(minimum = 0)]
    rx_bytes: u64,
    #[schema(minimum = 0)]
    tx_frames: u64,
    #[schema(minimum = 0)]
    tx_bytes: u64,
    /// Received frames larger than every buffer the guest could post: dropped.
    #[schema(minimum = 0)]
    rx_oversize: u64,
    /// Malformed transmit buffers: dropped.
    #[schema(minimum = 0)]
    tx_bad_chains: u64,
    /// Receive buffers the device could not write: returned empty.
    #[schema(minimum = 0)]
    rx_bad_chains: u64,
    /// Tap read and write errors.
    #[schema(minimum = 0)]
    rx_errors: u64,
    #[schema(minimum = 0)]
    tx_errors: u64,
    /// Times a received frame waited for the guest's receive buffers.
    #[schema(minimum = 0)]
    rx_waits: u64,
    /// Whether a received frame waits for them now.
    rx_frame_waiting: bool,
    /// Times the tap woke the device (it became readable).
    #[schema(minimum = 0)]
    tap_wakeups: u64,
    /// Queue runs that used buffers and interrupted the guest, and those
    /// whose interrupt the guest's EVENT_IDX `used_event` suppressed.
    #[schema(minimum = 0)]
    rx_interrupts: u64,
    #[schema(minimum = 0)]
    rx_interrupts_suppressed: u64,
    #[schema(minimum = 0)]
    tx_interrupts: u64,
    #[schema(minimum = 0)]
    tx_interrupts_suppressed: u64,
    /// The queue pairs the NIC has (one per vCPU, at most its
    /// `queue_pairs`) and those the guest's driver uses now.
    #[schema(minimum = 0)]
    queue_pairs: u16,
    #[schema(minimum = 0)]
    active_pairs: u16,
    /// Each queue pair's frames and bytes, in pair order.
    pairs: Vec<PairStatusSchema>,
    /// Control-queue requests answered OK and with an error, and control
    /// chains returned unanswered (malformed); multiqueue NICs only.
    #[schema(minimum = 0)]
    ctrl_ok: u64,
    #[schema(minimum = 0)]
    ctrl_err: u64,
    #[schema(minimum = 0)]
    ctrl_bad_chains: u64,
    /// The first pair's receive queue's indices; absent before the guest's
    /// driver set the device up (or while the device is busy for long).
    #[schema(nullable = false)]
    rx_queue: Option<QueueStatusSchema>,
    /// The transmit queue's indices, as `rx_queue`.
    #[schema(nullable = false)]
    tx_queue: Option<QueueStatusSchema>,
}

/// What one queue pair of a NIC moved (vnet headers included).
#[derive(ToSchema)]
#[schema(as = PairStatus)]
#[serde(deny_unknown_fields)]
pub struct PairStatusSchema {
    #[schema(minimum = 0)]
    rx_frames: u64,
    #[schema(minimum = 0)]
    rx_bytes: u64,
    #[schema(minimum = 0)]
    tx_frames: u64,
    #[schema(minimum = 0)]
    tx_bytes: u64,
}

/// A virtqueue's indices (free-running 16-bit counters).
#[derive(ToSchema)]
#[schema(as = QueueStatus)]
#[serde(deny_unknown_fields)]
pub struct QueueStatusSchema {
    size: u16,
    /// The guest's available index, and the next entry the device takes.
    avail_idx: u16,
    next_avail: u16,
    /// The used index the guest sees.
    used_idx: u16,
    /// EVENT_IDX: the guest wants an interrupt once the used index passes
    /// `used_event`; the device a notification once the available index
    /// passes `avail_event`.
    used_event: u16,
    avail_event: u16,
}

/// The stops of the VM's vCPUs that the dedup engine's parks caused (it
/// holds the vCPUs out of guest code while it merges, where that is
/// cheaper than interrupting them): one per vCPU kept waiting, as long as
/// it waited.
#[derive(ToSchema)]
#[schema(as = GuestPauses)]
#[serde(deny_unknown_fields)]
pub struct GuestPausesSchema {
    /// Stops so far.
    #[schema(minimum = 0)]
    count: u64,
    /// Their total length, seconds.
    #[schema(minimum = 0)]
    total_s: f64,
    /// The longest, seconds.
    #[schema(minimum = 0)]
    max_s: f64,
    /// The 99th percentile, seconds (the bound of its histogram bucket,
    /// capped by the maximum).
    #[schema(minimum = 0)]
    p99_s: f64,
    /// Stops per bucket, not cumulative; the buckets' upper bounds are
    /// 10, 25, 50, 100, 250 and 500 µs, 1, 2.5, 5, 10, 25, 50 and 100 ms,
    /// then +Inf (`pagefold_guest_pause_seconds` on /metrics).
    #[schema(min_items = 14, max_items = 14)]
    buckets: Vec<u64>,
}

/// A size: an integer number of MiB, or a string with a K, M, G or T suffix
/// such as "256M", "1G". VM memory must be a whole number of MiB, at least
/// 16 MiB; an odd number of MiB is rounded up to the next 2 MiB.
#[derive(ToSchema)]
#[schema(as = Size)]
#[serde(untagged)]
pub enum SizeSchema {
    Mib(u64),
    Text(String),
}

#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SerialTarget {
    Stdout,
    Null,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SerialFile {
    file: String,
}

/// Where serial output goes.
#[derive(ToSchema)]
#[schema(as = Serial)]
#[serde(untagged)]
pub enum SerialSchema {
    Target(SerialTarget),
    File(SerialFile),
}

#[derive(ToSchema)]
#[schema(as = VmDedup)]
#[serde(deny_unknown_fields)]
pub struct VmDedupSchema {
    #[schema(nullable = false, default = true)]
    enabled: Option<bool>,
    #[schema(min_length = 1)]
    group: Option<String>,
    /// The group's security; every VM of a group gives the same
    /// (docs/security.md). `hardened` needs the pagefold backend.
    #[schema(nullable = false, default = "default")]
    security: Option<DedupSecuritySchema>,
}

#[derive(ToSchema)]
#[schema(as = DedupSecurity)]
#[serde(rename_all = "lowercase")]
pub enum DedupSecuritySchema {
    Default,
    Hardened,
}

#[derive(ToSchema)]
#[schema(as = Placement)]
#[serde(rename_all = "lowercase")]
pub enum PlacementSchema {
    Linear,
    Scattered,
}

#[derive(ToSchema)]
#[schema(as = DiskConfig)]
#[serde(deny_unknown_fields)]
pub struct DiskSchema {
    path: String,
    #[schema(nullable = false)]
    readonly: Option<bool>,
}

/// The built-in workload guest (docs/workload-guest.md).
#[derive(ToSchema)]
#[schema(as = WorkloadConfig)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSchema {
    #[schema(nullable = false, default = 1)]
    seed: Option<u64>,
    private_seed: Option<u64>,
    shared: Option<SizeSchema>,
    private: Option<SizeSchema>,
    #[schema(nullable = false, maximum = 1000)]
    zero_permille: Option<u32>,
    #[schema(nullable = false, maximum = 1000)]
    dup_permille: Option<u32>,
    #[schema(nullable = false, maximum = 1000)]
    churn_permille: Option<u32>,
    #[schema(nullable = false)]
    churn_rate: Option<u32>,
    #[schema(nullable = false)]
    churn_ms: Option<u64>,
    /// In order: fill, churn, verify, rewrite, disk-read, sleep:MS, wait[:MS].
    #[schema(nullable = false)]
    phases: Option<Vec<String>>,
    /// Raw disk images the guest gets as virtio-blk devices.
    #[schema(nullable = false)]
    disks: Option<Vec<DiskSchema>>,
    /// Disk 0 is a test image made with this seed (disk-read checks it).
    disk_seed: Option<u64>,
    /// Layout of the guest's pages in guest-physical memory
    /// (docs/workload-guest.md, Placement); default linear.
    #[schema(nullable = false)]
    placement: Option<PlacementSchema>,
    /// Scattered placement only; pages per extent (default 1).
    #[schema(minimum = 1, maximum = 65536)]
    extent_pages: Option<u32>,
    /// Scattered placement only; seed of the permutation (default from the
    /// VM name).
    placement_seed: Option<u64>,
}

/// A network interface of a Linux guest: a virtio-net device on the host
/// tap `tap`, which must exist or be creatable by pagefold (docs/devices.md).
#[derive(ToSchema)]
#[schema(as = NetConfig)]
#[serde(deny_unknown_fields)]
pub struct NetSchema {
    /// The host tap interface's name.
    #[schema(min_length = 1, max_length = 15)]
    tap: String,
    /// A unicast MAC address, e.g. 52:54:00:12:34:56 (default: 52:54:00
    /// and three bytes derived from the VM's name and the NIC's index).
    #[schema(nullable = false, pattern = "^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")]
    mac: Option<String>,
    /// At most this many queue pairs (multiqueue); the NIC gets one per
    /// vCPU up to it (default 4).
    #[schema(nullable = false, minimum = 1, maximum = 16)]
    queue_pairs: Option<u16>,
}

#[derive(ToSchema)]
#[schema(as = KernelConfig)]
#[serde(deny_unknown_fields)]
pub struct KernelSchema {
    path: String,
    initrd: Option<String>,
    #[schema(nullable = false)]
    cmdline: Option<String>,
    #[schema(nullable = false)]
    disks: Option<Vec<DiskSchema>>,
    /// Network interfaces, after the disks in the virtio-mmio slots.
    #[schema(nullable = false)]
    net: Option<Vec<NetSchema>>,
    /// A memory balloon with free page reporting, after the NICs
    /// (`{}` for the defaults).
    #[schema(nullable = false)]
    balloon: Option<BalloonConfigSchema>,
}

/// A Linux guest's memory balloon (virtio-balloon, docs/devices.md).
#[derive(ToSchema)]
#[schema(as = BalloonConfig)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfigSchema {
    /// Offer free page reporting: pages the guest frees go back to the host.
    #[schema(nullable = false, default = true)]
    free_page_reporting: Option<bool>,
    /// Seconds between requests for the guest's memory statistics; 0
    /// offers no statistics queue.
    #[schema(nullable = false, minimum = 0, maximum = 3600, default = 5)]
    stats_interval_s: Option<u32>,
    /// The guest may take pages out of the balloon when it runs out of memory.
    #[schema(nullable = false, default = true)]
    deflate_on_oom: Option<bool>,
}

/// A VM's balloon: target, size, what it gave back, the guest's statistics.
#[derive(ToSchema)]
#[schema(as = BalloonStatus)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatusSchema {
    /// The size the host asks the balloon to be, MiB.
    #[schema(minimum = 0)]
    target_mib: u64,
    /// The size the guest says it has, MiB.
    #[schema(minimum = 0)]
    actual_mib: u64,
    free_page_reporting: bool,
    deflate_on_oom: bool,
    #[schema(minimum = 0)]
    stats_interval_s: u32,
    /// 4 KiB pages the guest put into the balloon, and took out.
    #[schema(minimum = 0)]
    inflated_pages: u64,
    #[schema(minimum = 0)]
    deflated_pages: u64,
    /// 4 KiB pages in the ranges free page reporting reported.
    #[schema(minimum = 0)]
    reported_pages: u64,
    /// Pages given back to the host (inflated and reported).
    #[schema(minimum = 0)]
    returned_pages: u64,
    #[schema(minimum = 0)]
    reports: u64,
    #[schema(minimum = 0)]
    stats_updates: u64,
    /// Malformed buffers the guest posted, returned untouched.
    #[schema(minimum = 0)]
    bad_chains: u64,
    /// PFNs or reported ranges outside guest RAM or not page aligned.
    #[schema(minimum = 0)]
    bad_ranges: u64,
    /// The guest's last memory statistics by virtio name (free_memory,
    /// total_memory, available_memory, ...: bytes; the rest counts).
    guest_stats: std::collections::BTreeMap<String, u64>,
    /// Seconds since the guest's statistics were read; absent before the
    /// first.
    #[schema(nullable = false, minimum = 0)]
    guest_stats_age_s: Option<f64>,
}

/// A VM, as a `[[vm]]` table of the TOML config. `name` may be left out
/// (the path's is used) and must equal the path's if given.
#[derive(ToSchema)]
#[schema(as = VmConfig)]
#[serde(deny_unknown_fields)]
pub struct VmConfigSchema {
    #[schema(nullable = false)]
    name: Option<VmNameSchema>,
    #[schema(nullable = false, minimum = 1, maximum = 64, default = 1)]
    vcpus: Option<u8>,
    memory: SizeSchema,
    #[schema(nullable = false)]
    serial: Option<SerialSchema>,
    #[schema(nullable = false)]
    dedup: Option<VmDedupSchema>,
    workload: Option<WorkloadSchema>,
    kernel: Option<KernelSchema>,
}
