//! The dedup engine on live workload VMs: exact sharing against an
//! independent oracle (the guest ABI's prediction, guest memory contents and
//! the kernel's pagemap), dedup groups, unmerge, and guest memory integrity
//! while guests rewrite memory under merging.

mod common;

use std::time::Duration;

use common::dedup::*;
use pagefold_dedup::Mode;
use pagefold_guest_abi::Placement;

const T: Duration = Duration::from_secs(90);
/// Maximum effort, so that settling is quick.
const MAX: &str = "pages_to_scan = 10000\nsleep_millisecs = 0";
/// Full scans without change that mean "settled": more than the engine's
/// longest smart-scan skip (7 passes) plus the two visits a page needs.
const SETTLE: u64 = 12;

fn two_vms(
    mode: &str,
    extra_dedup: &str,
    groups: (&str, &str),
    phases: &str,
    workload: &str,
) -> String {
    let vm = |name: &str, group: &str| {
        format!(
            r#"
            [[vm]]
            name = "{name}"
            memory = "64M"
            serial = "null"
            dedup = {{ group = "{group}" }}
            [vm.workload]
            seed = 5
            shared = "24M"
            private = "8M"
            zero_permille = 100
            dup_permille = 50
            phases = [{phases}]
            {workload}
            "#
        )
    };
    format!(
        "[dedup]\nmode = \"{mode}\"\n{extra_dedup}\n{}{}",
        vm("a", groups.0),
        vm("b", groups.1)
    )
}

/// Two VMs with the same seed in one group: after the engine settles, the
/// sharing it reports is exactly what a perfect dedup of the guests' memory
/// gives, the data areas hold exactly the ABI-predicted number of distinct
/// frames, and every zero data page maps the zero page.
#[test]
fn same_seed_in_one_group_merges_exactly() {
    merges_exactly("");
}

/// As [`same_seed_in_one_group_merges_exactly`], with the engine reading
/// pagemap for every visit instead of KVM's dirty log (`write_log = false`).
#[test]
fn same_seed_merges_exactly_without_the_write_log() {
    merges_exactly_with("", "write_log = false");
}

/// As [`same_seed_in_one_group_merges_exactly`], with each VM's pages
/// scattered one by one by its own permutation: identical content at
/// unrelated guest-physical addresses.
#[test]
fn scattered_pages_merge_exactly() {
    merges_exactly("placement = \"scattered\"\nextent_pages = 1");
}

/// As [`scattered_pages_merge_exactly`], in extents of 8 pages (readahead).
#[test]
fn scattered_extents_merge_exactly() {
    merges_exactly("placement = \"scattered\"\nextent_pages = 8");
}

/// The exact-sharing oracle for two same-seed VMs in one group, whose
/// `[vm.workload]` tables get `workload` (e.g. a placement).
fn merges_exactly(workload: &str) {
    merges_exactly_with(workload, "");
}

/// [`merges_exactly`] with `extra_dedup` in the `[dedup]` table. With the
/// write log on (the default), the engine must have used KVM's dirty log.
fn merges_exactly_with(workload: &str, extra_dedup: &str) {
    let logged = !extra_dedup.contains("write_log = false");
    let mut r = start(&two_vms(
        "on",
        &format!("{MAX}\n{extra_dedup}"),
        ("g", "g"),
        r#""fill", "wait", "verify""#,
        workload,
    ));
    wait_phases(&mut r, 1, T);
    let settled = wait_settled(&r, SETTLE, T);
    set_mode(&r, Mode::Off);
    std::thread::sleep(Duration::from_millis(200));
    let s = stats(&r);
    assert_eq!(
        s.pages_sharing, settled.pages_sharing,
        "sharing moved after the engine stopped"
    );
    let (a, b) = (&r.vms()[0], &r.vms()[1]);
    let e = expectation(&[a, b]);
    let (va, vb) = (view(a), view(b));
    let data: Vec<_> = va
        .iter()
        .chain(vb.iter())
        .filter(|p| p.in_data)
        .copied()
        .collect();
    assert_eq!(data.len() as u64, e.data_pages);
    // Every data-area page holds what the ABI predicts for its slot under
    // the VM's placement...
    let predicted: Vec<bool> = va
        .iter()
        .chain(vb.iter())
        .filter_map(|p| p.as_predicted)
        .collect();
    assert!(predicted.len() as u64 >= e.data_pages);
    let wrong = predicted.iter().filter(|&&ok| !ok).count();
    assert_eq!(wrong, 0, "{wrong} data-area pages differ from the ABI");
    // ...and the VMs' layouts are their placements': scattered VMs hold
    // the same logical page at the same address only by chance.
    let (la, lb) = (layout(a), layout(b));
    let same_gpa = (0..la.pages)
        .filter(|&i| la.page_gpa(i) == lb.page_gpa(i))
        .count() as u64;
    match (la.placement, lb.placement) {
        (Placement::Linear, Placement::Linear) => assert_eq!(same_gpa, la.pages),
        (
            Placement::Scattered {
                extent_pages: ea,
                seed: sa,
            },
            Placement::Scattered {
                extent_pages: eb,
                seed: sb,
            },
        ) => {
            assert_eq!(ea, eb);
            assert_ne!(sa, sb, "same permutation in both VMs");
            assert!(same_gpa < la.pages / 50, "{same_gpa} pages at the same GPA");
        }
        other => panic!("the VMs' placements differ in kind: {other:?}"),
    }
    // The ABI's prediction agrees with the guests' actual memory...
    assert_eq!(ideal_sharing(data.iter()), e.sharing_pages);
    assert_eq!(data.iter().filter(|p| p.zero).count() as u64, e.zero_pages);
    // ...and the kernel's page tables show exactly that much merged.
    let unmerged_dups = {
        let mut seen = std::collections::HashMap::new();
        for p in data.iter().filter(|p| !p.zero) {
            seen.entry(p.hash).or_insert_with(Vec::new).push(p.pfn);
        }
        seen.values()
            .filter(|f| f.len() > 1 && f.iter().any(|x| *x != f[0]))
            .count()
    };
    assert_eq!(
        distinct_frames(data.iter()),
        e.distinct_contents,
        "data frames vs distinct contents ({unmerged_dups} duplicated contents not on one frame; {s:?})"
    );
    let zpfn = zero_pfn();
    assert!(
        data.iter().filter(|p| p.zero).all(|p| p.pfn == zpfn),
        "zero data pages must map the zero page"
    );
    // Over all of guest RAM, the engine's count equals a perfect dedup.
    let all_ideal = ideal_sharing(va.iter().chain(vb.iter()));
    assert_eq!(
        s.pages_sharing, all_ideal,
        "engine pages_sharing vs ideal over all RAM: {s:?}"
    );
    assert!(s.pages_sharing >= e.sharing_pages);
    assert!(s.zero_pages >= e.zero_pages, "{s:?}");
    // Per-VM figures add up.
    assert!(
        s.per_owner.get("a").is_some_and(|o| o.pages_merged > 0),
        "{s:?}"
    );
    // Settling took passes over pages nobody wrote: the dirty log answered
    // those visits (or, without it, none was answered).
    if logged {
        assert!(s.write_logged_regions >= 2, "{s:?}");
        assert!(s.clean_visits > 0, "{s:?}");
    } else {
        assert_eq!((s.write_logged_regions, s.clean_visits), (0, 0), "{s:?}");
    }
    // KVM maps a dirty-logged slot 4 KiB at a time, so its RAM asks for no
    // transparent huge pages (`vm.rs`, `set_memslots`); unlogged RAM keeps
    // the host's setting.
    for vm in [a, b] {
        let (anon, nh) = anon_vmas_without_huge_pages(vm);
        assert!(anon > 0, "no anonymous VMA in the guest's RAM");
        if logged {
            assert!(
                nh > 0,
                "none of {anon} anonymous RAM VMAs is MADV_NOHUGEPAGE"
            );
        } else {
            assert_eq!(
                nh, 0,
                "{nh} of {anon} unlogged RAM VMAs are MADV_NOHUGEPAGE"
            );
        }
    }
    finish_ok(r);
}

/// The same VMs in two groups never share a frame across VMs; each still
/// merges its own in-guest duplicates.
#[test]
fn groups_never_share_across() {
    let mut r = start(&two_vms(
        "on",
        MAX,
        ("ga", "gb"),
        r#""fill", "wait", "verify""#,
        "",
    ));
    wait_phases(&mut r, 1, T);
    wait_settled(&r, SETTLE, T);
    set_mode(&r, Mode::Off);
    std::thread::sleep(Duration::from_millis(200));
    let (a, b) = (&r.vms()[0], &r.vms()[1]);
    let (va, vb) = (view(a), view(b));
    let frames_a: std::collections::HashSet<u64> =
        va.iter().filter(|p| !p.zero).map(|p| p.pfn).collect();
    let crossing = vb
        .iter()
        .filter(|p| !p.zero && frames_a.contains(&p.pfn))
        .count();
    assert_eq!(
        crossing, 0,
        "VMs in different groups share {crossing} frames"
    );
    for (vm, v) in [(a, &va), (b, &vb)] {
        let e = expectation(&[vm]);
        let data: Vec<_> = v.iter().filter(|p| p.in_data).copied().collect();
        assert_eq!(
            distinct_frames(data.iter()),
            e.distinct_contents,
            "in-guest duplicates of {}",
            vm.name()
        );
    }
    finish_ok(r);
}

/// `unmerge` gives every page its own private copy back, contents intact.
#[test]
fn unmerge_returns_private_pages() {
    let mut r = start(&two_vms(
        "on",
        "",
        ("g", "g"),
        r#""fill", "wait", "verify""#,
        "",
    ));
    wait_phases(&mut r, 1, T);
    let before = wait_settled(&r, 2, T);
    assert!(before.pages_sharing > 0);
    set_mode(&r, Mode::Unmerge);
    let end = std::time::Instant::now() + T;
    loop {
        let s = stats(&r);
        if s.mode == Mode::Off && s.pages_sharing == 0 && s.pages_shared == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "unmerge did not finish: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for vm in r.vms() {
        let file_backed = view(vm).iter().filter(|p| p.file).count();
        assert_eq!(
            file_backed,
            0,
            "{} still maps {file_backed} pool pages",
            vm.name()
        );
    }
    finish_ok(r);
}

/// Guests rewrite their private memory as fast as they can while the
/// engine merges at maximum effort; both verify every page afterwards.
#[test]
fn guests_churning_under_merging_lose_nothing() {
    churn_under_merging("");
}

/// As [`guests_churning_under_merging_lose_nothing`], with both VMs'
/// pages scattered by their own permutations (extents of 1 and of 4
/// pages): churned pages interleave with merged ones.
#[test]
fn scattered_guests_churning_under_merging_lose_nothing() {
    churn_under_merging("placement = \"scattered\"\nextent_pages = 1");
    churn_under_merging("placement = \"scattered\"\nextent_pages = 4");
}

fn churn_under_merging(workload: &str) {
    let mut r = start(&two_vms(
        "on",
        "pages_to_scan = 10000\nsleep_millisecs = 0",
        ("g", "g"),
        r#""fill", "churn:1500", "verify", "churn:1500", "verify", "wait", "verify""#,
        &format!("churn_permille = 600\n{workload}"),
    ));
    wait_phases(&mut r, 5, T);
    let s = stats(&r);
    assert!(s.merges > 0, "the engine merged nothing: {s:?}");
    assert!(s.write_logged_regions >= 2, "{s:?}");
    finish_ok(r);
    // finish_ok checked three verify phases per VM with zero mismatches.
}
