//! The modelled build (BUILD phase): two VMs build one source tree side by
//! side, with different placements of their build areas; both must report
//! the output checksum, pages written and pages reused that the host
//! computes from the same generator and the same compile/link code.

mod common;

use std::time::Duration;

use common::*;
use pagefold_guest_abi::build::{expected, image_bytes, tree_pages, TreeSpec};

const LIMIT: Duration = Duration::from_secs(120);
const SPEC: TreeSpec = TreeSpec {
    seed: 0xb11d,
    files: 150,
    rounds: 10,
};

#[test]
fn two_vms_build_one_tree_to_the_predicted_output() {
    require_kvm();
    let dir = TempDir::new("build-two");
    let img = dir.path("tree.img");
    std::fs::write(&img, image_bytes(SPEC)).unwrap();
    let want = expected(SPEC);
    let vm = |name: &str, build: &str, placement: &str| {
        format!(
            r#"
            [[vm]]
            name = "{name}"
            memory = "64M"
            [vm.workload]
            shared = "2M"
            private = "2M"
            phases = ["fill", "{build}", "verify"]
            disks = [{{ path = {path:?}, readonly = true }}]
            {placement}
            "#,
            path = img.display().to_string()
        )
    };
    // Two scattered placements of the build's own (keyed by the VMs'
    // private seeds), one linear, one from the VM's placement (extents of
    // 4 pages): the output must not depend on where pages sit.
    let cfg = dir.path("two.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}{}{}{}",
            vm("left", "build", ""),
            vm("right", "build:scattered", ""),
            vm("lin", "build:linear", ""),
            vm(
                "placed",
                "build",
                "placement = \"scattered\"\nextent_pages = 4"
            )
        ),
    )
    .unwrap();
    let json = dir.path("report.json");
    let o = run_config(&cfg, &json, LIMIT);
    assert!(o.status.success(), "{}", text(&o));
    let r = read_json(&json);
    for name in ["left", "right", "lin", "placed"] {
        let v = vm_of(&r, name);
        assert_eq!(v["exit_status"], 0, "{v}");
        let b = phases(v, "build");
        assert_eq!(b.len(), 1, "{v}");
        let b = b[0];
        assert_eq!(b["checksum"], want.checksum, "{name}: {b}");
        assert_eq!(b["pages"], tree_pages(&SPEC), "{name}: {b}");
        assert_eq!(b["pages_written"], want.pages_written, "{name}: {b}");
        assert_eq!(b["pages_reused"], want.pages_reused, "{name}: {b}");
        assert!(b["cpu_ms"].as_f64().unwrap() > 0.0, "{b}");
        assert!(
            b["cpu_ms"].as_f64().unwrap() <= b["ms"].as_f64().unwrap() + 1.0,
            "{b}"
        );
        // The build stayed inside its area: the workload's pages are intact.
        assert_eq!(phases(v, "verify")[0]["mismatches"], 0, "{v}");
    }
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("guest: build: 150 files"), "{out}");
}

#[test]
fn a_disk_that_is_no_tree_is_a_disk_error() {
    require_kvm();
    let dir = TempDir::new("build-bad");
    let img = dir.path("junk.img");
    std::fs::write(&img, vec![0x5a; 64 * 4096]).unwrap();
    let disk = format!("{},ro", img.display());
    let o = run(
        &[
            "run",
            "--memory",
            "64M",
            "--shared",
            "2M",
            "--private",
            "2M",
            "--phases",
            "fill,build",
            "--disk",
            &disk,
        ],
        LIMIT,
    );
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("not a build tree"), "{out}");
}

fn vm_of<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    common::vm(r, name)
}

#[cfg(feature = "bench")]
#[test]
fn bench_build_refuses_bad_flags_before_running_anything() {
    for (flags, what) in [
        (&["--runs", "0"][..], "--runs"),
        (&["--systems", "ksm-max"][..], "ksm-max"),
        (&["--auto-trigger", "1.5"][..], "--auto-trigger"),
    ] {
        let mut args = vec!["bench", "build"];
        args.extend_from_slice(flags);
        let o = run(&args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", text(&o));
        assert!(text(&o).contains(what), "{flags:?}: {}", text(&o));
    }
}

/// Without the `bench` feature the binary has no benchmarks, and says how
/// to build them (whatever the arguments) instead of "unrecognized
/// subcommand".
#[cfg(not(feature = "bench"))]
#[test]
fn bench_without_the_feature_says_how_to_build_it() {
    for args in [
        &["bench"][..],
        &["bench", "build", "--runs", "0"],
        &["bench", "--help"],
    ] {
        let o = run(args, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("--features bench"),
            "{args:?}: {}",
            text(&o)
        );
    }
}
