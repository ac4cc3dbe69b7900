//! The config file: TOML text -> `Config` -> validation, and the JSON form
//! `pagefold vm create` sends for each VM (`PUT /api/v1/vms/NAME`) must
//! read back as the same VM.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pagefold_vmm::config::{validate_vm_name, Config};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::from_toml(text, Path::new("fuzz.toml")) else {
        return;
    };
    let _ = cfg.validate(Some(8 << 30));
    let _ = cfg.validate(None);
    // Parsing checked the dedup settings: any knobs they give are valid.
    let knobs = cfg.dedup.settings.knobs_over(pagefold_dedup::DEFAULT_KNOBS);
    assert!(knobs.validate().is_ok(), "parsed dedup settings are checked");
    for vm in &cfg.vms {
        let _ = vm.validate();
        let _ = vm.memory_bytes();
        let _ = vm.memory_note();
        let _ = vm.dedup_group();
        if let Some(w) = &vm.workload {
            let _ = w.validate();
            let _ = w.parsed_phases();
            let _ = w.placement(&vm.name);
        }
        if validate_vm_name(&vm.name).is_err() {
            continue;
        }
        // What the CLI sends, and what the API makes of it.
        let body = serde_json::to_vec(vm).expect("a VmConfig serializes to JSON");
        let v: serde_json::Value =
            pagefold_api::body::parse(&body).expect("the JSON form of a VmConfig parses");
        let back = pagefold_api::vms::config_for(&vm.name, v)
            .expect("the JSON form of a VmConfig is a VmConfig");
        assert_eq!(&back, vm, "TOML -> JSON -> API changed the VM");
    }
});
