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

/// Mappings (VMAs) of this process: the lines of `/proc/self/maps`. A
/// merger that remaps pages splits VMAs, and a process stops getting new
/// ones at `vm.max_map_count`.
pub fn self_vmas() -> Option<u64> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    Some(maps.iter().filter(|&&b| b == b'\n').count() as u64)
}

/// `vm.max_map_count`.
pub fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
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
    fn counts_this_process_mappings() {
        let before = self_vmas().unwrap();
        assert!(before > 5 && before < max_map_count().unwrap());
        // Every line is a mapping: the count matches the file's lines
        // that start with an address range (other tests map and unmap
        // concurrently, so compare with a second reading loosely).
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let ranges = text
            .lines()
            .filter(|l| l.split(' ').next().is_some_and(|r| r.contains('-')))
            .count() as u64;
        assert!(ranges.abs_diff(before) < 1000, "{before} vs {ranges}");
    }

    #[test]
    fn parses_loadavg() {
        assert_eq!(
            parse_loadavg("1.40 2.63 3.36 2/345 6789\n"),
            [1.40, 2.63, 3.36]
        );
        assert_eq!(parse_loadavg(""), [0.0; 3]);
    }
}
