//! docs/metrics.md's table of the metric families, made from the
//! catalogue (whose tests check that the doc holds it).

use super::catalogue::{Kind, FAMILIES};

/// docs/metrics.md's table of the families.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Metric | Type | Labels | `GET /api/v1/dedup` field | node_exporter (KSM) | Meaning |\n\
         |---|---|---|---|---|---|\n",
    );
    let code = |s: &str| format!("`{s}`");
    let list = |xs: &[&str]| {
        if xs.is_empty() {
            String::new()
        } else {
            xs.iter().map(|x| code(x)).collect::<Vec<_>>().join(", ")
        }
    };
    for f in FAMILIES {
        let kind = match f.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        };
        out.push_str(&format!(
            "| {} | {kind} | {} | {} | {} | {} |\n",
            code(&f.sample_name()),
            list(f.labels),
            list(f.source),
            f.ksmd.map(code).unwrap_or_default(),
            f.help.replace('|', "\\|"),
        ));
    }
    out
}
