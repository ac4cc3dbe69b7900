//! What a benchmark run deduplicates: one 300 MiB region of a 2022 test
//! shape, or two workload VMs with identical content. Both attach to a
//! backend, are measured the same way, and detach so that the next run
//! starts from nothing.

use std::fmt;
use std::sync::Arc;

use pagefold_dedup::{DedupBackend, RegionId, RegionSpec};
use serde::{Serialize, Serializer};

use crate::error::BenchError;
use crate::region::{Region, Shape};
use crate::vms::{Expected, VmOptions, VmPair};

/// One test case of `ksm-seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// A region of `bytes` filled with a 2022 test shape.
    Region(Shape),
    /// Two workload VMs with identical content ([`VmOptions`]).
    Vms,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Case::Region(s) => s.fmt(f),
            Case::Vms => f.write_str("vms"),
        }
    }
}

/// Serialized as the `shape` string of a row: `full`, `sparse` or `vms`.
impl Serialize for Case {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Memory attached to a backend for one run.
pub enum Attached {
    Region { region: Region, id: RegionId },
    Vms(VmPair),
}

impl Attached {
    /// Fills the memory and registers it with `backend` (mode still off).
    pub fn attach(
        backend: &Arc<dyn DedupBackend>,
        case: Case,
        region_bytes: usize,
        vm: &VmOptions,
        progress: bool,
    ) -> Result<Attached, BenchError> {
        match case {
            Case::Region(shape) => {
                let mut region = Region::map(region_bytes)?;
                region.fill(shape);
                let spec = RegionSpec {
                    host_addr: region.addr(),
                    len: region.len(),
                    owner: "ksm-seed".into(),
                    group: "ksm-seed".into(),
                };
                // SAFETY: region is a private anonymous mapping that outlives
                // the registration: `detach` unregisters before dropping it.
                let id =
                    unsafe { backend.register(spec) }.map_err(|source| BenchError::Backend {
                        system: backend.name().into(),
                        source,
                    })?;
                Ok(Attached::Region { region, id })
            }
            Case::Vms => Ok(Attached::Vms(VmPair::start(backend, vm, progress)?)),
        }
    }

    /// The exact expectation, where one is known beyond the shape's ideal.
    pub fn expected(&self) -> Option<Expected> {
        match self {
            Attached::Region { .. } => None,
            Attached::Vms(p) => Some(p.expected),
        }
    }

    /// The region's address range (KSM page counting), if a region.
    pub fn region(&self) -> Option<&Region> {
        match self {
            Attached::Region { region, .. } => Some(region),
            Attached::Vms(_) => None,
        }
    }

    /// Unregisters (regions: merged pages get private copies back) or stops
    /// the VMs (their teardown drops the pages).
    pub fn detach(self, backend: &dyn DedupBackend) -> Result<(), BenchError> {
        match self {
            Attached::Region { region, id } => {
                backend
                    .unregister(id)
                    .map_err(|source| BenchError::Backend {
                        system: backend.name().into(),
                        source,
                    })?;
                drop(region);
                Ok(())
            }
            Attached::Vms(p) => {
                p.stop();
                Ok(())
            }
        }
    }
}
