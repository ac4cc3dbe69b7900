//! A Linux guest's memory balloon (`[vm.kernel.balloon]`): virtio-balloon
//! with free page reporting, statistics and deflate on OOM
//! (docs/devices.md).

use serde::{Deserialize, Serialize};

/// Longest interval between two requests for the guest's statistics.
pub const MAX_STATS_INTERVAL_S: u32 = 3600;

/// The balloon of a Linux guest. `balloon = {}` gives the defaults: free
/// page reporting on, statistics every 5 s, deflate on OOM on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfig {
    /// Offer free page reporting: pages the guest frees go back to the
    /// host (the guest needs `CONFIG_PAGE_REPORTING`).
    #[serde(default = "yes")]
    pub free_page_reporting: bool,
    /// Seconds between requests for the guest's memory statistics; 0
    /// offers no statistics queue.
    #[serde(default = "default_stats_interval")]
    pub stats_interval_s: u32,
    /// Let the guest take pages out of the balloon when it runs out of
    /// memory, rather than go out of memory with the balloon inflated.
    #[serde(default = "yes")]
    pub deflate_on_oom: bool,
}

fn yes() -> bool {
    true
}

fn default_stats_interval() -> u32 {
    5
}

impl Default for BalloonConfig {
    fn default() -> Self {
        Self {
            free_page_reporting: true,
            stats_interval_s: default_stats_interval(),
            deflate_on_oom: true,
        }
    }
}

impl BalloonConfig {
    /// Checks the interval; the message names the bad value.
    pub fn validate(&self) -> Result<(), String> {
        if self.stats_interval_s > MAX_STATS_INTERVAL_S {
            return Err(format!(
                "balloon: stats_interval_s {} is above {MAX_STATS_INTERVAL_S}",
                self.stats_interval_s
            ));
        }
        Ok(())
    }

    /// Parses the CLI's `--balloon` value: `on` (the defaults), or
    /// comma-separated `reporting=on|off`, `stats=SECONDS`,
    /// `deflate_on_oom=on|off`.
    pub fn parse_flag(s: &str) -> Result<Self, String> {
        let mut c = Self::default();
        if s.trim() == "on" {
            return Ok(c);
        }
        let onoff = |k: &str, v: &str| match v {
            "on" | "true" => Ok(true),
            "off" | "false" => Ok(false),
            _ => Err(format!("--balloon {k}={v:?}: expected on or off")),
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("--balloon: {part:?} is not KEY=VALUE (or `on`)"))?;
            match k {
                "reporting" => c.free_page_reporting = onoff(k, v)?,
                "deflate_on_oom" => c.deflate_on_oom = onoff(k, v)?,
                "stats" => {
                    c.stats_interval_s = v
                        .parse()
                        .map_err(|_| format!("--balloon stats={v:?}: expected seconds"))?
                }
                _ => {
                    return Err(format!(
                        "--balloon: unknown key {k:?} (expected reporting, stats, deflate_on_oom)"
                    ))
                }
            }
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_and_the_table_give_the_same_settings() {
        assert_eq!(
            BalloonConfig::parse_flag("on").unwrap(),
            BalloonConfig::default()
        );
        let c = BalloonConfig::parse_flag("reporting=off,stats=0,deflate_on_oom=off").unwrap();
        assert_eq!(
            c,
            BalloonConfig {
                free_page_reporting: false,
                stats_interval_s: 0,
                deflate_on_oom: false
            }
        );
        let t: BalloonConfig = toml::from_str("stats_interval_s = 2").unwrap();
        assert_eq!(t.stats_interval_s, 2);
        assert!(t.free_page_reporting && t.deflate_on_oom);
        for bad in [
            "stats=x",
            "reporting=maybe",
            "colour=red",
            "stats",
            "stats=3601",
        ] {
            let e = BalloonConfig::parse_flag(bad).unwrap_err();
            assert!(e.contains("--balloon") || e.contains("3600"), "{bad}: {e}");
        }
        assert!(toml::from_str::<BalloonConfig>("speed = 1").is_err());
    }
}
