//! Checks the OpenAPI spec: the committed `api/openapi.json` is the one the
//! code generates; every documented operation is served (the router and
//! the spec come from one route table, this checks the wiring); every
//! status a scenario of requests gets is documented for its operation,
//! every JSON answer validates against the documented schema, and the
//! requests the server accepts validate against the documented request
//! schemas.

use axum::body::Body;
use axum::http::{header, Request};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::router::router;
use crate::state::AppState;
use crate::testutil::FakeVmm;
use crate::PREFIX;

const COMMITTED: &str = include_str!("../openapi.json");

fn spec() -> Value {
    serde_json::from_str(COMMITTED).unwrap()
}

/// The committed spec is the generated one; `UPDATE_OPENAPI=1` rewrites it.
#[test]
fn committed_openapi_is_generated() {
    let generated = crate::spec::json().unwrap();
    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        std::fs::write(path, &generated).unwrap();
        return;
    }
    assert!(
        generated == COMMITTED,
        "api/openapi.json is not the spec the code generates; regenerate it: {}",
        crate::spec::REGENERATE
    );
}

const METHODS: [&str; 5] = ["get", "put", "patch", "delete", "post"];

#[tokio::test]
async fn documented_operations_are_served() {
    let s = spec();
    assert!(s["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(s["servers"][0]["url"], PREFIX);
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = router(AppState::new(vmm.handle.clone()));
    let mut ops = 0;
    for (path, item) in s["paths"].as_object().unwrap() {
        for (m, _) in item.as_object().unwrap() {
            if !METHODS.contains(&m.as_str()) || m == "put" && path == "/shutdown" {
                continue;
            }
            let uri = format!("{PREFIX}{}", path.replace("{name}", "vm0"));
            let req = Request::builder()
                .method(m.to_uppercase().as_str())
                .uri(&uri)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                status != 405 && !text.contains("no route for"),
                "{m} {uri} is documented but not served: {status} {text}"
            );
            ops += 1;
        }
    }
    assert_eq!(ops, 10, "documented operations (besides shutdown)");
}

/// Wraps a schema so its `#/components/...` references resolve.
fn rooted(schema: &Value, s: &Value) -> Value {
    let mut v = schema.clone();
    v.as_object_mut()
        .unwrap()
        .insert("components".into(), s["components"].clone());
    v
}

fn validate(schema: &Value, s: &Value, instance: &Value, what: &str) {
    let root = rooted(schema, s);
    let v = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&root)
        .unwrap_or_else(|e| panic!("{what}: bad schema: {e}"));
    let errors: Vec<String> = v
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: {instance} does not match the spec: {errors:?}"
    );
}

/// Follows a `$ref` to `#/components/...`.
fn deref<'a>(s: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => s
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling {r}")),
        None => v,
    }
}

/// The operation for a concrete request path.
fn operation<'a>(s: &'a Value, method: &str, path: &str) -> &'a Value {
    let rel = path.strip_prefix(PREFIX).unwrap();
    let key = if rel.starts_with("/vms/") {
        "/vms/{name}"
    } else {
        rel
    };
    &s["paths"][key][method.to_lowercase()]
}

async fn check(
    app: &axum::Router,
    s: &Value,
    method: &str,
    path: &str,
    body: Option<Value>,
    want: u16,
) {
    let op = operation(s, method, path);
    assert!(op.is_object(), "{method} {path} not in the spec");
    if let (Some(b), true) = (&body, want < 300) {
        let schema = &deref(s, &op["requestBody"])["content"]["application/json"]["schema"];
        validate(schema, s, b, &format!("request {method} {path}"));
    }
    let mut rb = Request::builder().method(method).uri(path);
    if body.is_some() {
        rb = rb.header(header::CONTENT_TYPE, "application/json");
    }
    let req = rb
        .body(Body::from(body.map(|b| b.to_string()).unwrap_or_default()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    assert_eq!(status, want, "{method} {path}");
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let documented = deref(s, &op["responses"][status.to_string()]);
    assert!(
        documented.is_object(),
        "{method} {path}: status {status} is not documented"
    );
    match documented.get("content") {
        None => assert!(bytes.is_empty(), "{method} {path}: undocumented body"),
        Some(content) => {
            let ct = ct.unwrap_or_else(|| panic!("{method} {path}: no content type"));
            let media = ct.split(';').next().unwrap().trim();
            let entry = &content[media];
            assert!(entry.is_object(), "{method} {path}: {media} not documented");
            if media == "application/json" {
                let v: Value = serde_json::from_slice(&bytes).unwrap();
                validate(
                    &entry["schema"],
                    s,
                    &v,
                    &format!("response {method} {path} {status}"),
                );
            }
        }
    }
}

#[tokio::test]
async fn answers_match_the_spec() {
    let s = spec();
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = router(AppState::new(vmm.handle.clone()));
    let p = |x: &str| format!("{PREFIX}{x}");
    let vm = json!({"vcpus": 1, "memory": "64M", "serial": "null", "dedup": {"group": "g"},
                    "workload": {"seed": 3, "shared": "16M", "phases": ["fill", "wait"]}});
    let cases: Vec<(&str, String, Option<Value>, u16)> = vec![
        ("GET", p("/health"), None, 200),
        ("GET", p("/metrics"), None, 200),
        ("GET", p("/vms"), None, 200),
        ("GET", p("/vms/vm0"), None, 200),
        ("GET", p("/vms/ghost"), None, 404),
        ("GET", p("/vms/-rf"), None, 400),
        ("DELETE", p("/vms/..x"), None, 400),
        ("PUT", p("/vms/vm1"), Some(vm.clone()), 201),
        ("PUT", p("/vms/vm1"), Some(vm), 409),
        (
            "PUT",
            p("/vms/vm2"),
            Some(json!({"memory": 64, "vcpus": 0})),
            400,
        ),
        (
            "PUT",
            p("/vms/vm3"),
            Some(json!({"memory": 64, "serial": {"file": "/dev/null"}})),
            201,
        ),
        (
            "PUT",
            p("/vms/vm4"),
            Some(json!({"memory": 64, "workload": {"placement": "scattered",
                        "extent_pages": 8, "placement_seed": 5}})),
            201,
        ),
        (
            "PATCH",
            p("/vms/vm1"),
            Some(json!({"state": "paused"})),
            200,
        ),
        (
            "PATCH",
            p("/vms/vm1"),
            Some(json!({"state": "running"})),
            200,
        ),
        ("PATCH", p("/vms/vm1"), Some(json!({"state": "gone"})), 400),
        (
            "PATCH",
            p("/vms/stopping"),
            Some(json!({"state": "paused"})),
            409,
        ),
        (
            "PATCH",
            p("/vms/ghost"),
            Some(json!({"state": "paused"})),
            404,
        ),
        ("DELETE", p("/vms/vm1"), None, 204),
        ("DELETE", p("/vms/vm1"), None, 404),
        ("GET", p("/dedup"), None, 200),
        (
            "PATCH",
            p("/dedup"),
            Some(json!({"mode": "auto", "pages_to_scan": 1000})),
            200,
        ),
        ("PATCH", p("/dedup"), Some(json!({"pages_to_scan": 0})), 400),
        ("PATCH", p("/dedup"), Some(json!({"mode": "unmerge"})), 409),
        ("PUT", p("/shutdown"), None, 202),
        ("GET", p("/vms"), None, 503),
        ("GET", p("/health"), None, 503),
        ("GET", p("/metrics"), None, 503),
        ("PUT", p("/shutdown"), None, 503),
    ];
    for (m, path, body, want) in cases {
        check(&app, &s, m, &path, body, want).await;
    }
    let none = FakeVmm::start(false, &[]);
    let app = router(AppState::new(none.handle.clone()));
    check(&app, &s, "GET", &p("/health"), None, 200).await;
    check(&app, &s, "GET", &p("/dedup"), None, 404).await;
    check(
        &app,
        &s,
        "PATCH",
        &p("/dedup"),
        Some(json!({"mode": "on"})),
        409,
    )
    .await;
}

#[tokio::test]
async fn a_stalled_engine_answers_as_documented() {
    let s = spec();
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = router(AppState::new(vmm.handle.clone()));
    let p = |x: &str| format!("{PREFIX}{x}");
    let overdue = &vmm.backend.as_ref().unwrap().overdue;
    overdue.store(true, std::sync::atomic::Ordering::Relaxed);
    check(&app, &s, "GET", &p("/health"), None, 503).await;
    check(&app, &s, "GET", &p("/dedup"), None, 200).await;
    check(&app, &s, "GET", &p("/metrics"), None, 200).await;
    overdue.store(false, std::sync::atomic::Ordering::Relaxed);
    check(&app, &s, "GET", &p("/health"), None, 200).await;
}

/// The documented VM config is the VMM's: a config with every field set,
/// as the VMM's own type writes it, validates against `VmConfig` (which
/// allows no other fields), and so does a config with only the defaults.
#[test]
fn documented_vm_config_is_the_vmms() {
    let s = spec();
    let schema = json!({"$ref": "#/components/schemas/VmConfig"});
    let full: pagefold_vmm::config::VmConfig = serde_json::from_value(json!({
        "name": "full", "vcpus": 2, "memory": "64M", "serial": {"file": "/dev/null"},
        "dedup": {"enabled": true, "group": "g"},
        "workload": {"seed": 3, "private_seed": 4, "shared": "16M", "private": 8,
            "zero_permille": 10, "dup_permille": 20, "churn_permille": 30, "churn_rate": 5,
            "churn_ms": 100, "phases": ["fill", "wait"], "disks": [{"path": "/d", "readonly": true}],
            "disk_seed": 9, "placement": "scattered", "extent_pages": 8, "placement_seed": 5},
        "kernel": {"path": "/k", "initrd": "/i", "cmdline": "quiet",
            "disks": [{"path": "/d", "readonly": false}],
            "net": [{"tap": "tap0", "mac": "52:54:00:12:34:56"}, {"tap": "tap1"}]}
    }))
    .unwrap();
    let written = serde_json::to_value(&full).unwrap();
    validate(&schema, &s, &written, "VmConfig with every field");
    let minimal: pagefold_vmm::config::VmConfig =
        serde_json::from_value(json!({"name": "min", "memory": 64})).unwrap();
    let written = serde_json::to_value(&minimal).unwrap();
    validate(&schema, &s, &written, "VmConfig with defaults");
}

/// The documented VM name pattern is the one the VMM enforces.
#[test]
fn documented_vm_name_is_the_vmms() {
    let s = spec();
    assert_eq!(
        s["components"]["schemas"]["VmName"]["pattern"],
        format!("^{}$", pagefold_vmm::config::VM_NAME_PATTERN)
    );
}
