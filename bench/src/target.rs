//! What a benchmark run deduplicates: one 300 MiB region of a 2022 test
//! shape, the two regions of the `scattered` shape, or two workload VMs
//! with identical content. All attach to a backend, are measured the same
//! way, and detach so that the next run starts from nothing.

use std::fmt;
use std::sync::Arc;

use pagefold_dedup::{DedupBackend, RegionId, RegionSpec};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::BenchError;
use crate::region::{Region, Shape, SCATTERED_SEED};
use crate::vms::{Expected, VmOptions, VmPair};

/// One test case of `ksm-seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Host regions filled with a [`Shape`].
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

/// Read back from the `shape` string a row was written with.
impl<'de> Deserialize<'de> for Case {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "full" => Ok(Case::Region(Shape::Full)),
            "sparse" => Ok(Case::Region(Shape::Sparse)),
            "scattered" => Ok(Case::Region(Shape::Scattered)),
            "vms" => Ok(Case::Vms),
            other => Err(serde::de::Error::unknown_variant(
                other,
                &["full", "sparse", "scattered", "vms"],
            )),
        }
    }
}

/// Region sizes of the region shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSizes {
    /// The one region of `full` and `sparse`.
    pub seed_bytes: usize,
    /// Each of the two regions of `scattered`.
    pub scattered_bytes: usize,
}

/// Memory attached to a backend for one run.
pub enum Attached {
    /// Host regions, all registered in one dedup group.
    Regions(Vec<(Region, RegionId)>),
    Vms(VmPair),
}

/// Maps and fills the regions of `shape` (not registered yet).
pub fn make_regions(shape: Shape, sizes: RegionSizes) -> Result<Vec<Region>, BenchError> {
    match shape {
        Shape::Full | Shape::Sparse => {
            let mut r = Region::map(sizes.seed_bytes)?;
            r.fill(shape);
            Ok(vec![r])
        }
        Shape::Scattered => {
            let mut a = Region::map(sizes.scattered_bytes)?;
            a.fill(shape);
            let mut b = Region::map(sizes.scattered_bytes)?;
            b.fill_permuted(&a, SCATTERED_SEED, 1);
            Ok(vec![a, b])
        }
    }
}

impl Attached {
    /// Fills the memory and registers it with `backend` (mode still off).
    pub fn attach(
        backend: &Arc<dyn DedupBackend>,
        case: Case,
        sizes: RegionSizes,
        vm: &VmOptions,
        progress: bool,
    ) -> Result<Attached, BenchError> {
        match case {
            Case::Region(shape) => {
                let regions = make_regions(shape, sizes)?;
                let many = regions.len() > 1;
                let mut attached = Vec::new();
                for (i, region) in regions.into_iter().enumerate() {
                    let spec = RegionSpec {
                        host_addr: region.addr(),
                        len: region.len(),
                        owner: if many {
                            format!("ksm-seed-{}", (b'a' + i as u8) as char)
                        } else {
                            "ksm-seed".into()
                        },
                        group: "ksm-seed".into(),
                        security: Default::default(),
                    };
                    // SAFETY: region is a private anonymous mapping that
                    // outlives the registration: `detach` (or the error path
                    // below) unregisters before dropping it.
                    match unsafe { backend.register(spec) } {
                        Ok(id) => attached.push((region, id)),
                        Err(source) => {
                            // Unregister what was registered, then drop.
                            let _ = Attached::Regions(attached).detach(&**backend);
                            return Err(BenchError::backend(backend.name())(source));
                        }
                    }
                }
                Ok(Attached::Regions(attached))
            }
            Case::Vms => Ok(Attached::Vms(VmPair::start(backend, vm, progress)?)),
        }
    }

    /// The exact expectation, where one is known beyond the shape's ideal.
    pub fn expected(&self) -> Option<Expected> {
        match self {
            Attached::Regions(_) => None,
            Attached::Vms(p) => Some(p.expected),
        }
    }

    /// The host regions (KSM page counting); empty for VMs.
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        let r: &[(Region, RegionId)] = match self {
            Attached::Regions(r) => r,
            Attached::Vms(_) => &[],
        };
        r.iter().map(|(region, _)| region)
    }

    /// Unregisters (regions: merged pages get private copies back) or stops
    /// the VMs (their teardown drops the pages). Every region is
    /// unregistered even if one fails; the first error is returned.
    pub fn detach(self, backend: &dyn DedupBackend) -> Result<(), BenchError> {
        match self {
            Attached::Regions(regions) => {
                let mut first = Ok(());
                for (region, id) in regions {
                    let r = backend
                        .unregister(id)
                        .map_err(BenchError::backend(backend.name()));
                    match r {
                        Ok(()) => drop(region),
                        Err(e) => {
                            // Still registered: leak the mapping rather
                            // than unmap memory the backend may touch.
                            std::mem::forget(region);
                            if first.is_ok() {
                                first = Err(e);
                            }
                        }
                    }
                }
                first
            }
            Attached::Vms(p) => {
                p.stop();
                Ok(())
            }
        }
    }
}
