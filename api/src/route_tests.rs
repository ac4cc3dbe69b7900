//! Route tests: every endpoint's success and error paths, through the real
//! router (in process, no socket), against the pretend VMM loop.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::router::router;
use crate::state::AppState;
use crate::testutil::FakeVmm;

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
    /// Errors are JSON objects with a string `error` field.
    fn error(&self) -> String {
        let v = self.json();
        assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
        v["error"].as_str().unwrap().to_string()
    }
}

fn app(vmm: &FakeVmm) -> Router {
    router(AppState::new(vmm.handle.clone()))
}

async fn send(app: &Router, method: &str, uri: &str, body: Option<&str>) -> Answer {
    let mut b = Request::builder().method(method).uri(uri);
    if body.is_some() {
        b = b.header(header::CONTENT_TYPE, "application/json");
    }
    let req = b.body(Body::from(body.unwrap_or("").to_string())).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

#[tokio::test]
async fn health_reports_vms_and_backend() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let a = send(&app(&vmm), "GET", "/api/v1/health", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json(),
        json!({"status": "ok", "vms": 2, "dedup_backend": "test",
               "engine": {"backend": "test", "responding": true,
                          "last_wakeup_age_ms": 15, "wakeup_overdue": false}})
    );
    let none = FakeVmm::start(false, &[]);
    let a = send(&app(&none), "GET", "/api/v1/health", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json(),
        json!({"status": "ok", "vms": 0, "dedup_backend": null, "engine": null})
    );
}

#[tokio::test]
async fn health_is_503_while_the_engine_is_stalled() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    let backend = vmm.backend.as_ref().unwrap();
    backend
        .overdue
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let a = send(&app, "GET", "/api/v1/health", None).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    let v = a.json();
    assert_eq!(v["status"], "stalled", "{v}");
    assert_eq!(v["engine"]["wakeup_overdue"], true, "{v}");
    assert_eq!(v["engine"]["last_wakeup_age_ms"], 60_000, "{v}");
    // The same figure in /dedup and the metrics.
    let d = send(&app, "GET", "/api/v1/dedup", None).await.json();
    assert_eq!(d["last_wakeup_age_ms"], 60_000, "{d}");
    assert_eq!(d["wakeup_overdue"], true, "{d}");
    let m = send(&app, "GET", "/api/v1/metrics", None).await.text;
    assert!(
        m.contains("pagefold_dedup_last_wakeup_age_seconds 60.0\n"),
        "{m}"
    );
    assert!(m.contains("pagefold_dedup_wakeup_overdue 1\n"), "{m}");
    // It wakes up again: healthy again.
    backend
        .overdue
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let a = send(&app, "GET", "/api/v1/health", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["status"], "ok");
}

#[tokio::test]
async fn vms_list_get_and_missing() {
    let vmm = FakeVmm::start(false, &["vm0"]);
    let app = app(&vmm);
    let a = send(&app, "GET", "/api/v1/vms", None).await;
    assert_eq!(a.status, StatusCode::OK);
    let names: Vec<_> = a
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["stopping", "vm0"]);
    let a = send(&app, "GET", "/api/v1/vms/vm0", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["state"], "running");
    assert_eq!(a.json()["memory_bytes"], 64 << 20);
    let a = send(&app, "GET", "/api/v1/vms/nope", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error(), "no VM named \"nope\"");
    let a = send(&app, "GET", "/api/v1/vms/%FF", None).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text);
    assert!(a.error().contains("invalid VM name"));
}

#[tokio::test]
async fn put_creates_vm_and_checks_input() {
    let vmm = FakeVmm::start(false, &[]);
    let app = app(&vmm);
    let body = r#"{"memory": "64M", "vcpus": 2, "workload": {"phases": ["fill", "wait"]}}"#;
    let a = send(&app, "PUT", "/api/v1/vms/new", Some(body)).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(a.json()["name"], "new");
    assert_eq!(a.json()["vcpus"], 2);
    // Exists already.
    let a = send(&app, "PUT", "/api/v1/vms/new", Some(body)).await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert!(a.error().contains("already exists"));
    // Name mismatch, unknown field, bad JSON, no body, invalid config.
    for (b, needle) in [
        (r#"{"name": "other", "memory": 64}"#, "differs"),
        (r#"{"memory": 64, "cpus": 1}"#, "unknown field `cpus`"),
        (r#"{"memory": "#, "invalid JSON"),
        ("", "needs a JSON body"),
        (r#"{"memory": 64, "vcpus": 0}"#, "vcpus"),
        (r#"{"memory": "12X"}"#, "invalid size"),
        (r#""#, "needs a JSON body"),
        (
            r#"{"memory": 64, "kernel": {"path": "/k", "net": [{"tap": "t", "mac": "01:00:5e:00:00:01"}]}}"#,
            "invalid MAC address 01:00:5e:00:00:01",
        ),
        (
            r#"{"memory": 64, "kernel": {"path": "/k", "net": [{"mac": "52:54:00:00:00:01"}]}}"#,
            "missing field `tap`",
        ),
    ] {
        let a = send(&app, "PUT", "/api/v1/vms/x1", Some(b)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{b}: {}", a.text);
        assert!(a.error().contains(needle), "{b}: {}", a.text);
    }
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    let big = format!(
        "{{\"memory\": 64, \"pad\": \"{}\"}}",
        "x".repeat(100 * 1024)
    );
    let a = send(&app, "PUT", "/api/v1/vms/big", Some(&big)).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(a.error().contains("65536"), "{}", a.text);
    let a = send(&app, "PATCH", "/api/v1/dedup", Some(&big)).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn patch_pauses_and_resumes() {
    let vmm = FakeVmm::start(false, &["vm0"]);
    let app = app(&vmm);
    let a = send(
        &app,
        "PATCH",
        "/api/v1/vms/vm0",
        Some(r#"{"state": "paused"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["state"], "paused");
    let a = send(
        &app,
        "PATCH",
        "/api/v1/vms/vm0",
        Some(r#"{"state": "running"}"#),
    )
    .await;
    assert_eq!(a.json()["state"], "running");
    let a = send(
        &app,
        "PATCH",
        "/api/v1/vms/vm0",
        Some(r#"{"state": "asleep"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.error().contains("asleep"));
    let a = send(
        &app,
        "PATCH",
        "/api/v1/vms/vm0",
        Some(r#"{"state": "paused", "x": 1}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let a = send(
        &app,
        "PATCH",
        "/api/v1/vms/ghost",
        Some(r#"{"state": "paused"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = send(
        &app,
        "PATCH",
        "/api/v1/vms/stopping",
        Some(r#"{"state": "paused"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn delete_removes_then_404() {
    let vmm = FakeVmm::start(false, &["vm0"]);
    let app = app(&vmm);
    let a = send(&app, "DELETE", "/api/v1/vms/vm0", None).await;
    assert_eq!(a.status, StatusCode::NO_CONTENT);
    assert!(a.text.is_empty());
    let a = send(&app, "DELETE", "/api/v1/vms/vm0", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = send(&app, "GET", "/api/v1/vms/vm0", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn dedup_get_shows_stats_knobs_limits() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let a = send(&app(&vmm), "GET", "/api/v1/dedup", None).await;
    assert_eq!(a.status, StatusCode::OK);
    let v = a.json();
    assert_eq!(v["backend"], "test");
    assert_eq!(v["mode"], "on");
    assert_eq!(v["pages_sharing"], 30);
    assert_eq!(v["knobs"]["pages_to_scan"], 100);
    assert_eq!(
        v["limits"]["pages_to_scan"],
        json!({"min": 1, "max": 1u64 << 24})
    );
    assert_eq!(v["per_owner"]["vm0"]["pages_merged"], 40);
    assert_eq!(v["auto"]["total_bytes"], 1u64 << 30);
    assert_eq!(v["auto"]["auto_triggered"], false);
    assert_eq!(v["auto_config"]["auto_threshold"], 20);
}

#[tokio::test]
async fn dedup_patch_validates_like_the_cli() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"mode": "auto", "pages_to_scan": 500}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["mode"], "auto");
    assert_eq!(a.json()["knobs"]["pages_to_scan"], 500);
    assert_eq!(a.json()["settle"], true);
    let a = send(&app, "PATCH", "/api/v1/dedup", Some(r#"{"settle": false}"#)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["settle"], false);
    assert_eq!(a.json()["mode"], "auto", "the mode stays");
    // Out of range: 400 naming field and range; nothing changes (the mode
    // in the same request stays too).
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"mode": "off", "sleep_millisecs": 60001}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.error(),
        "invalid value for sleep_millisecs: 60001 (valid range 0..=60000)"
    );
    let cli = crate::patch::from_pairs(&["mode=off", "sleep_millisecs=60001"])
        .unwrap_err()
        .to_string();
    assert_eq!(a.error(), cli, "API and CLI must say the same");
    let v = send(&app, "GET", "/api/v1/dedup", None).await.json();
    assert_eq!(v["mode"], "auto");
    assert_eq!(v["knobs"]["sleep_millisecs"], 20);
    for (b, needle) in [
        (r#"{"mode": "sometimes"}"#, "unknown dedup mode"),
        (
            r#"{"max_page_sharing": 1}"#,
            "max_page_sharing: 1 (valid range 2..=65536)",
        ),
        (r#"{"pages_to_scan": -1}"#, "invalid JSON"),
        (r#"{"pages_to_scan": "5"}"#, "invalid type"),
        (r#"{"turbo": true}"#, "unknown field `turbo`"),
        (r#"{"settle": "off"}"#, "invalid type"),
        (r#"[]"#, "invalid JSON"),
    ] {
        let a = send(&app, "PATCH", "/api/v1/dedup", Some(b)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{b}: {}", a.text);
        assert!(a.error().contains(needle), "{b}: {}", a.text);
    }
    // Auto-mode settings go to the controller, checked the same way.
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"auto_threshold": 35, "memory_signal": "available"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["auto_config"]["auto_threshold"], 35);
    assert_eq!(a.json()["auto_config"]["memory_signal"], "available");
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"auto_threshold": 101}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.error(),
        "auto_threshold must be a percentage in 0..=100, got 101"
    );
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"max_scanning_factor": 0}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.error().contains("max_scanning_factor must be in 1..="),
        "{}",
        a.text
    );
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"max_scanning_factor": 1000000000}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.text);
    assert!(
        a.error().contains("max_scanning_factor must be in 1..="),
        "{}",
        a.text
    );
    // The backend refuses a mode it cannot do: a conflict, not a bug.
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"mode": "unmerge"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    // An empty update changes nothing and shows the state.
    let a = send(&app, "PATCH", "/api/v1/dedup", Some("{}")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["mode"], "auto");
}

#[tokio::test]
async fn dedup_without_backend_is_404_and_a_refused_start_changes_nothing() {
    let vmm = FakeVmm::start(false, &["vm0"]);
    let app = app(&vmm);
    let a = send(&app, "GET", "/api/v1/dedup", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.error().contains("no dedup backend"), "{}", a.error());
    // The VMM cannot start a backend: the reason, and still none.
    let a = send(&app, "PATCH", "/api/v1/dedup", Some(r#"{"mode":"on"}"#)).await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert!(
        a.error().contains("cannot start deduplication") && a.error().contains("userfaultfd"),
        "{}",
        a.error()
    );
    let a = send(&app, "GET", "/api/v1/dedup", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn patch_starts_a_backend_in_a_process_without_one() {
    let vmm = FakeVmm::start_late(&["vm0"]);
    let app = app(&vmm);
    // Bad input is refused before anything starts.
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"mode":"sideways"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"pages_to_scan":0}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(vmm.late_backend().is_none());
    assert_eq!(
        send(&app, "GET", "/api/v1/dedup", None).await.status,
        StatusCode::NOT_FOUND
    );
    let a = send(&app, "PATCH", "/api/v1/dedup", Some(r#"{"mode":"on"}"#)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json()["mode"], "on");
    let b = vmm.late_backend().expect("a backend was started");
    assert_eq!(
        pagefold_dedup::DedupBackend::mode(b.as_ref()),
        pagefold_dedup::Mode::On
    );
    let a = send(&app, "GET", "/api/v1/dedup", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["mode"], "on");
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let a = send(&app(&vmm), "GET", "/api/v1/metrics", None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    assert!(
        a.text.contains(
            "# TYPE pagefold_dedup_pages_sharing gauge\npagefold_dedup_pages_sharing 30\n"
        ),
        "{}",
        a.text
    );
    assert!(a
        .text
        .contains("pagefold_dedup_vm_pages_merged{vm=\"vm0\",group=\"g\"} 40\n"));
    assert!(a
        .text
        .contains("pagefold_vm_state{vm=\"vm0\",state=\"running\"} 1\n"));
    assert!(
        a.text
            .contains("pagefold_dedup_auto_host_memory_bytes{kind=\"total\"} 1073741824\n"),
        "{}",
        a.text
    );
    assert!(
        a.text.contains("pagefold_dedup_auto_threshold_ratio 0.2\n"),
        "{}",
        a.text
    );
}

/// `/metrics` (Prometheus' default scrape path) serves what
/// `/api/v1/metrics` does; wrong methods there are a JSON 405 too.
#[tokio::test]
async fn metrics_are_also_at_the_conventional_path() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    let root = send(&app, "GET", "/metrics", None).await;
    let api = send(&app, "GET", "/api/v1/metrics", None).await;
    assert_eq!(root.status, StatusCode::OK);
    assert_eq!(
        root.headers[header::CONTENT_TYPE],
        api.headers[header::CONTENT_TYPE]
    );
    let series = |t: &str| -> Vec<String> {
        t.lines()
            // Figures of the moment: the VMs' uptimes, the process's
            // memory and CPU.
            .filter(|l| !l.starts_with("pagefold_vm_uptime_seconds") && !l.starts_with("process_"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(series(&root.text), series(&api.text));
    assert!(root.text.contains("pagefold_vms 2\n"), "{}", root.text);
    let post = send(&app, "POST", "/metrics", None).await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(post.error().contains("not allowed"), "{}", post.error());
}

/// A scraper that asks for OpenMetrics (Prometheus does) gets it.
#[tokio::test]
async fn metrics_speak_openmetrics_when_asked() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let req = Request::builder()
        .uri("/metrics")
        .header(
            header::ACCEPT,
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .body(Body::empty())
        .unwrap();
    let resp = app(&vmm).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("# TYPE pagefold_dedup_merges counter\npagefold_dedup_merges_total "),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_routes_404_and_wrong_methods_405_as_json() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    for uri in [
        "/",
        "/api/v1",
        "/api/v1/nope",
        "/api/v2/vms",
        "/api/v1/vms/a/b",
    ] {
        let a = send(&app, "GET", uri, None).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{uri}");
        assert!(a.error().contains("no route"), "{uri}");
    }
    for (m, uri, allow) in [
        ("POST", "/api/v1/vms", "GET,HEAD"),
        ("DELETE", "/api/v1/dedup", "GET,HEAD,PATCH"),
        ("GET", "/api/v1/shutdown", "PUT"),
        ("POST", "/api/v1/vms/vm0", "GET,HEAD,PUT,PATCH,DELETE"),
        ("PUT", "/api/v1/metrics", "GET,HEAD"),
    ] {
        let a = send(&app, m, uri, None).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{m} {uri}");
        assert!(a.error().contains("not allowed"));
        let got = a.headers[header::ALLOW].to_str().unwrap().replace(' ', "");
        let mut got: Vec<_> = got.split(',').collect();
        let mut want: Vec<_> = allow.split(',').collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{m} {uri}");
    }
}

#[tokio::test]
async fn shutdown_then_unavailable() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    let a = send(&app, "PUT", "/api/v1/shutdown", None).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    assert_eq!(a.json()["status"], "shutting down");
    // The VMM is gone: VM calls answer 503; dedup (no VMM call) still works.
    let a = send(&app, "GET", "/api/v1/vms", None).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.error(), "the VMM is shutting down");
    let a = send(&app, "GET", "/api/v1/health", None).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn duplicate_keys_and_bad_names_are_refused() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let app = app(&vmm);
    let a = send(
        &app,
        "PUT",
        "/api/v1/vms/vm5",
        Some(r#"{"memory": "64M", "vcpus": 1, "memory": "8G"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.error().contains("duplicate key \"memory\""), "{}", a.text);
    let a = send(&app, "GET", "/api/v1/vms/vm5", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "nothing was created");
    let a = send(
        &app,
        "PATCH",
        "/api/v1/dedup",
        Some(r#"{"pages_to_scan": 10, "pages_to_scan": 20}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.error().contains("duplicate key \"pages_to_scan\""),
        "{}",
        a.text
    );
    for bad in ["-rf", "..", ".", "_x"] {
        for m in ["GET", "DELETE", "PUT"] {
            let body = (m == "PUT").then_some(r#"{"memory": 64}"#);
            let a = send(&app, m, &format!("/api/v1/vms/{bad}"), body).await;
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{m} {bad}: {}", a.text);
            assert!(a.error().contains("invalid VM name"), "{}", a.text);
        }
    }
}
