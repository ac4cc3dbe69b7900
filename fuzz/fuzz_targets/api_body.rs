//! API request bodies: `PUT /api/v1/vms/NAME` (a VM config), `PATCH
//! /api/v1/vms/NAME` (a state change), `PATCH /api/v1/dedup` (knobs and
//! mode), and the CLI's `KEY=VALUE` form of the latter, through the same
//! parsing and validation the handlers use (no VMM, no backend).
//!
//! Input: one selector byte; for the VM routes a length byte and the
//! path's VM name; the rest is the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagefold_api::vms::StatePatch;
use pagefold_api::{body, patch, vms};
use pagefold_dedup::auto::AutoConfig;
use pagefold_dedup::{CheckedSettings, DedupSettings, Knobs};
use pagefold_fuzz::Input;
use pagefold_vmm::config::{validate_vm_name, Config};

/// Host RAM the checks assume (8 GiB).
const HOST_MEM: u64 = 8 << 30;

fn put_vm(name: &str, b: &[u8]) {
    if validate_vm_name(name).is_err() {
        return; // the router answers 400 before reading the body
    }
    let Ok(v) = body::parse::<serde_json::Value>(b) else {
        return;
    };
    let Ok(vc) = vms::config_for(name, v) else {
        return;
    };
    assert_eq!(vc.name, name, "config_for must keep the path's name");
    // What the VMM runs on a CreateVm request.
    let cfg = Config {
        dedup: Default::default(),
        vms: vec![vc.clone()],
        stdin: None,
        seccomp: None,
    };
    let _ = cfg.validate(Some(HOST_MEM));
    let _ = vc.memory_bytes();
    let _ = vc.memory_note();
    let _ = vc.dedup_group();
    if let Some(w) = &vc.workload {
        let _ = w.parsed_phases();
        let _ = w.placement(name);
    }
}

fn check_dedup(c: &CheckedSettings, current: &Knobs) {
    assert!(
        c.knobs_over(*current).validate().is_ok(),
        "checked settings give valid knobs"
    );
    let a = AutoConfig::default().overlaid(c);
    let _ = a.validate(HOST_MEM, c.knobs_over(*current).pages_to_scan);
    let _ = c.touches_auto();
}

fn patch_dedup(b: &[u8], current: &Knobs) {
    let Ok(p) = body::parse::<DedupSettings>(b) else {
        return;
    };
    if let Ok(c) = p.validate() {
        check_dedup(&c, current);
    }
    // The JSON a client would send for these settings reads back the same.
    let again = serde_json::to_vec(&p).expect("DedupSettings serialize");
    let q: DedupSettings = body::parse(&again).expect("serialized DedupSettings parse");
    assert_eq!(p, q);
}

fn dedup_pairs(b: &[u8], current: &Knobs) {
    let text = String::from_utf8_lossy(b);
    let pairs: Vec<&str> = text.split('\n').take(64).collect();
    if let Ok(c) = patch::from_pairs(&pairs) {
        check_dedup(&c, current);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let selector = input.u8();
    let current = Knobs {
        pages_to_scan: 100,
        sleep_millisecs: 20,
        max_page_sharing: 256,
    };
    match selector % 4 {
        0 => {
            let n = usize::from(input.u8());
            let name = String::from_utf8_lossy(input.bytes(n)).into_owned();
            put_vm(&name, input.rest());
        }
        1 => patch_dedup(input.rest(), &current),
        2 => {
            let _ = body::parse::<StatePatch>(input.rest());
        }
        _ => dedup_pairs(input.rest(), &current),
    }
});
