//! Seeds derived from names. Its own module because both the config (the
//! default placement seed) and the workload wiring (the private-content
//! seed) need it, and the workload imports the config.

/// A stable 64-bit seed from a VM name (FNV-1a), so a VM's private content is
/// the same from run to run but differs between VMs.
pub fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
