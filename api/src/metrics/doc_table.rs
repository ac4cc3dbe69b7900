//! docs/metrics.md's table of the metric families, made from the
//! catalogue, so that the documentation cannot drift from the code.

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

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file(rel: &str) -> String {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/..").to_string() + "/" + rel;
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// docs/metrics.md holds exactly the catalogue's table, between its
    /// markers: the documentation cannot drift from the code.
    #[test]
    fn docs_table_is_the_catalogue() {
        let doc = repo_file("docs/metrics.md");
        let (begin, end) = (
            "<!-- metrics-table:begin -->\n",
            "<!-- metrics-table:end -->",
        );
        let start = doc.find(begin).expect("begin marker") + begin.len();
        let stop = doc.find(end).expect("end marker");
        let want = markdown_table();
        assert!(
            doc[start..stop] == want,
            "docs/metrics.md's table differs from api/src/metrics/catalogue.rs; it should be:\n{want}"
        );
    }
}
