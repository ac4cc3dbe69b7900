//! How a metric family reads its samples from a scrape: the helpers the
//! catalogue's `rows` functions are made of.

use crate::dedup_view::{AutoView, ByOriginView, DedupView, OriginsView, OwnerView};

use super::process::ProcessFigures;
use super::{BuildInfo, Num, Scrape};

/// A family's samples: label values (in the order of `Family::labels`)
/// and the value. `None`: the family is absent from this scrape (no dedup
/// backend, no auto-mode controller, /proc unreadable).
pub type Rows = Option<Vec<(Vec<String>, Num)>>;

pub(super) fn one(n: impl Into<Num>) -> Rows {
    Some(vec![(Vec::new(), n.into())])
}

pub(super) fn dedup(s: &Scrape, f: fn(&DedupView) -> Num) -> Rows {
    s.dedup.as_ref().and_then(|d| one(f(d)))
}

pub(super) fn auto(s: &Scrape, f: fn(&AutoView) -> Num) -> Rows {
    s.dedup
        .as_ref()
        .and_then(|d| d.auto.as_ref())
        .and_then(|a| one(f(a)))
}

pub(super) fn process(s: &Scrape, f: fn(&ProcessFigures) -> Option<Num>) -> Rows {
    s.process.as_ref().and_then(f).and_then(one)
}

pub(super) fn per_vm(s: &Scrape, f: fn(&pagefold_vmm::vm::VmInfo) -> Num) -> Rows {
    Some(s.vms.iter().map(|v| (vec![v.name.clone()], f(v))).collect())
}

pub(super) fn per_owner(s: &Scrape, f: fn(&OwnerView) -> u64) -> Rows {
    s.dedup.as_ref().map(|d| {
        d.per_owner
            .iter()
            .map(|(vm, o)| (vec![vm.clone(), o.group.clone()], Num::U(f(o))))
            .collect()
    })
}

/// Like [`per_owner`], for a figure some backends do not have per owner:
/// only the owners that have it.
pub(super) fn per_owner_some(s: &Scrape, f: fn(&OwnerView) -> Option<u64>) -> Rows {
    s.dedup.as_ref().map(|d| {
        d.per_owner
            .iter()
            .filter_map(|(vm, o)| Some((vec![vm.clone(), o.group.clone()], Num::U(f(o)?))))
            .collect()
    })
}

/// One row per VM that has a balloon.
pub(super) fn per_balloon(s: &Scrape, f: fn(&pagefold_vmm::balloon::BalloonStatus) -> Num) -> Rows {
    Some(
        s.vms
            .iter()
            .filter_map(|v| Some((vec![v.name.clone()], f(v.balloon.as_ref()?))))
            .collect(),
    )
}

/// One row per NIC of every VM, labelled by VM and tap.
pub(super) fn per_nic(s: &Scrape, f: fn(&pagefold_vmm::nic::NicStatus) -> u64) -> Rows {
    Some(
        s.vms
            .iter()
            .flat_map(|v| {
                v.nics
                    .iter()
                    .map(|n| (vec![v.name.clone(), n.tap.clone()], Num::U(f(n))))
            })
            .collect(),
    )
}

/// Rows per NIC of every VM and per value of one more label: `f` gives
/// (label value, figure) pairs.
pub(super) fn per_nic_by(
    s: &Scrape,
    f: fn(&pagefold_vmm::nic::NicStatus) -> Vec<(&'static str, u64)>,
) -> Rows {
    Some(
        s.vms
            .iter()
            .flat_map(|v| {
                v.nics.iter().flat_map(|n| {
                    f(n).into_iter().map(|(label, x)| {
                        (
                            vec![v.name.clone(), n.tap.clone(), label.to_string()],
                            Num::U(x),
                        )
                    })
                })
            })
            .collect(),
    )
}

/// Rows per queue pair of every NIC of every VM and per direction
/// (`rx`, `tx`): `f` gives a pair's (received, sent) figure.
pub(super) fn per_nic_pair(
    s: &Scrape,
    f: fn(&pagefold_vmm::nic::PairStatus) -> (u64, u64),
) -> Rows {
    Some(
        s.vms
            .iter()
            .flat_map(|v| {
                v.nics.iter().flat_map(move |n| {
                    n.pairs.iter().enumerate().flat_map(move |(i, p)| {
                        let (rx, tx) = f(p);
                        [("rx", rx), ("tx", tx)].map(|(dir, x)| {
                            (
                                vec![
                                    v.name.clone(),
                                    n.tap.clone(),
                                    i.to_string(),
                                    dir.to_string(),
                                ],
                                Num::U(x),
                            )
                        })
                    })
                })
            })
            .collect(),
    )
}

/// One row per VM with a balloon and guest statistic that `pick` names:
/// its label value (the statistic's, or what `pick` makes of it).
pub(super) fn per_guest_stat(s: &Scrape, pick: fn(&str) -> Option<&'static str>) -> Rows {
    Some(
        s.vms
            .iter()
            .filter_map(|v| v.balloon.as_ref().map(|b| (v, b)))
            .flat_map(|(v, b)| {
                b.guest_stats.iter().filter_map(|(k, &n)| {
                    let label = pick(k)?;
                    Some((vec![v.name.clone(), label.to_string()], Num::U(n)))
                })
            })
            .collect(),
    )
}

/// A figure only some backends have (`None` leaves the family out).
pub(super) fn dedup_some(s: &Scrape, f: fn(&DedupView) -> Option<u64>) -> Rows {
    s.dedup.as_ref().and_then(f).and_then(one)
}

pub(super) fn ms_to_s(ms: f64) -> Num {
    Num::F(ms / 1000.0)
}

pub(super) fn build(b: &BuildInfo) -> Rows {
    Some(vec![(
        vec![b.version.clone(), b.commit.clone(), b.features.clone()],
        Num::U(1),
    )])
}

/// The scrape's dedup view when its backend is the pagefold engine.
fn pagefold_view(s: &Scrape) -> Option<&DedupView> {
    s.dedup.as_ref().filter(|d| d.backend == "pagefold")
}

/// A figure of the pagefold engine alone (the KSM backend has none).
pub(super) fn pagefold_only(s: &Scrape, f: fn(&DedupView) -> Num) -> Rows {
    pagefold_view(s).and_then(|d| one(f(d)))
}

/// One row per merge origin (pagefold engine).
pub(super) fn by_origin(s: &Scrape, f: fn(&OriginsView) -> ByOriginView) -> Rows {
    let b = f(&pagefold_view(s)?.origins);
    Some(
        [
            ("steady", b.steady),
            ("second_look", b.second_look),
            ("first_sight", b.first_sight),
            ("hinted", b.hinted),
        ]
        .into_iter()
        .map(|(o, n)| (vec![o.to_string()], Num::U(n)))
        .collect(),
    )
}
