//! pagefold's dedup engine: a userspace samepage-merging engine for any
//! registered host memory region. It knows nothing of KVM: the VMM registers
//! regions, the engine sees memory.

pub mod backend;
pub mod policy;

pub use backend::{DedupBackend, Error, KnobUpdate, Knobs, Mode, RegionId, RegionSpec, Stats};
pub use policy::{RoundPlan, RoundPolicy};
pub mod auto;
pub mod ksm;
