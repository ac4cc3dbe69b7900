//! Reading and writing the ABI structs in guest memory through vm-memory.

use pagefold_guest_abi::mailbox::PhaseReport;
use pagefold_guest_abi::pause::PauseHistogram;
use pagefold_guest_abi::WorkloadParams;
use vm_memory::ByteValued;

/// An ABI struct viewed as plain bytes (vm-memory's `ByteValued` is a
/// foreign trait, and the ABI crate has no dependencies, hence the newtype).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Plain<T>(pub T);

// SAFETY: WorkloadParams is #[repr(C)] of u64/u32 fields only, without
// padding (pinned by the ABI's layout test), so every byte pattern is a valid
// value and it has no references. `Plain` is repr(transparent).
unsafe impl ByteValued for Plain<WorkloadParams> {}

// SAFETY: as above: PhaseReport is #[repr(C)], integers only, no padding.
unsafe impl ByteValued for Plain<PhaseReport> {}

// SAFETY: as above: PauseHistogram is #[repr(C)], an array of u32 only.
unsafe impl ByteValued for Plain<PauseHistogram> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_bytes() {
        let p = Plain(WorkloadParams {
            seed: 7,
            program: [1; 16],
            ..WorkloadParams::default()
        });
        let q = Plain::<WorkloadParams>::from_slice(p.as_slice()).unwrap();
        assert_eq!(q.0, p.0);
        assert_eq!(p.as_slice().len(), std::mem::size_of::<WorkloadParams>());
    }
}
