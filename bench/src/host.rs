//! Facts about the host that qualify a measurement: load from other work
//! (the machine is shared with builds), other KSM users, real free memory.

/// `/proc/loadavg`'s 1, 5 and 15 minute averages (zeros if unreadable).
pub fn load_avg() -> [f64; 3] {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").unwrap_or_default())
}

/// Parses the first three fields of `/proc/loadavg`.
pub fn parse_loadavg(text: &str) -> [f64; 3] {
    let mut out = [0.0; 3];
    for (o, f) in out.iter_mut().zip(text.split_whitespace()) {
        *o = f.parse().unwrap_or(0.0);
    }
    out
}

/// `MemAvailable` of `/proc/meminfo` in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    pagefold_dedup::auto::parse_meminfo(&text)
        .ok()
        .map(|s| s.available_bytes)
}

/// Other processes using KSM make host-wide counters and scan times
/// include their pages.
pub fn other_ksm_users() -> Vec<String> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).ok()?;
            let s = pagefold_dedup::ksm::parse_ksm_stat(&text);
            let mergeable = text.lines().any(|l| l.trim() == "ksm_mergeable: yes");
            (mergeable || s.merging_pages.unwrap_or(0) > 0).then(|| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                format!("{pid} ({})", comm.trim())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_loadavg() {
        assert_eq!(
            parse_loadavg("1.40 2.63 3.36 2/345 6789\n"),
            [1.40, 2.63, 3.36]
        );
        assert_eq!(parse_loadavg(""), [0.0; 3]);
    }
}
