//! The one line a Linux build guest prints on its serial console when its
//! build has ended (scripts/linux-build-bench.sh writes the guest's init):
//!
//! ```text
//! PAGEFOLD-BUILD-RESULT real=612.40 user=1150.22 sys=98.10 status=0 sha256=<64 hex digits>
//! ```
//!
//! `real`, `user`, `sys` are GNU time's `%e %U %S` for `make -j$(nproc)
//! TARGETS` inside the guest; `status` is that command's exit status;
//! `sha256` is the hash of the object files it built (each file's sha256,
//! in name order, hashed again), or `-` when the build failed. The parser is strict (every key exactly once, no other
//! key): a line from another version of the script must fail loudly rather
//! than fill the table with misread figures.

use serde::{Deserialize, Serialize};

/// Starts the result line.
pub const RESULT_MARKER: &str = "PAGEFOLD-BUILD-RESULT";
/// The guest prints this line just before the timed build starts: the
/// host measures its own CPU and the merging from there.
pub const START_MARKER: &str = "PAGEFOLD-BUILD-START";

/// What one guest reported about its build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinuxBuildResult {
    /// Wall-clock seconds of the build, measured in the guest.
    pub real_s: f64,
    /// The build's user and system CPU seconds inside the guest (all
    /// make jobs: up to vCPUs x real).
    pub user_s: f64,
    pub sys_s: f64,
    /// Exit status of `make -j TARGETS`.
    pub status: u8,
    /// sha256 over the built objects (lower-case hex); None when the
    /// build failed.
    pub sha256: Option<String>,
}

impl LinuxBuildResult {
    /// The first 8 bytes of the hash as a number, for the table's
    /// `checksums` (0 when there is no hash).
    pub fn checksum(&self) -> u64 {
        self.sha256
            .as_deref()
            .and_then(|h| h.get(..16))
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(0)
    }
}

/// Why a result line could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResultLineError {
    #[error("no {RESULT_MARKER} marker in the line")]
    NoMarker,
    #[error("result line lacks {0}=")]
    Missing(&'static str),
    #[error("result line gives {0}= twice")]
    Duplicate(String),
    #[error("result line has an unknown field {0:?}")]
    Unknown(String),
    #[error("result line: {key}={value:?} is not {expected}")]
    Malformed {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("result line: status {status} does not fit sha256={sha256:?} (a hash comes with status 0 only, '-' with a failure)")]
    Inconsistent { status: u8, sha256: String },
}

const KEYS: [&str; 5] = ["real", "user", "sys", "status", "sha256"];

fn seconds(key: &'static str, v: &str) -> Result<f64, ResultLineError> {
    let bad = || ResultLineError::Malformed {
        key,
        value: v.to_string(),
        expected: "a number of seconds (digits, optionally a decimal point)",
    };
    // GNU time prints plain decimals; refuse what f64::from_str would also
    // take (inf, NaN, exponents, signs).
    if v.is_empty()
        || !v.chars().all(|c| c.is_ascii_digit() || c == '.')
        || v.matches('.').count() > 1
        || v == "."
    {
        return Err(bad());
    }
    v.parse::<f64>().map_err(|_| bad())
}

/// Parses a result line. Text before the marker is skipped (a kernel
/// message may have been printed on the same console line); trailing
/// whitespace and a carriage return are ignored.
pub fn parse_result_line(line: &str) -> Result<LinuxBuildResult, ResultLineError> {
    let at = line.find(RESULT_MARKER).ok_or(ResultLineError::NoMarker)?;
    let rest = &line[at + RESULT_MARKER.len()..];
    if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
        return Err(ResultLineError::NoMarker);
    }
    let mut found: [Option<&str>; 5] = [None; 5];
    for field in rest.split_whitespace() {
        let (k, v) = field
            .split_once('=')
            .ok_or_else(|| ResultLineError::Unknown(field.to_string()))?;
        let i = KEYS
            .iter()
            .position(|&key| key == k)
            .ok_or_else(|| ResultLineError::Unknown(k.to_string()))?;
        if found[i].replace(v).is_some() {
            return Err(ResultLineError::Duplicate(k.to_string()));
        }
    }
    let get = |i: usize| found[i].ok_or(ResultLineError::Missing(KEYS[i]));
    let real_s = seconds("real", get(0)?)?;
    let user_s = seconds("user", get(1)?)?;
    let sys_s = seconds("sys", get(2)?)?;
    let status_text = get(3)?;
    let status = status_text
        .parse::<u8>()
        .ok()
        .filter(|_| status_text.chars().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| ResultLineError::Malformed {
            key: "status",
            value: status_text.to_string(),
            expected: "an exit status 0..=255",
        })?;
    let hash = get(4)?;
    let sha256 = if hash == "-" {
        None
    } else if hash.len() == 64
        && hash
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    {
        Some(hash.to_string())
    } else {
        return Err(ResultLineError::Malformed {
            key: "sha256",
            value: hash.to_string(),
            expected: "64 lower-case hex digits or '-'",
        });
    };
    if (status == 0) != sha256.is_some() {
        return Err(ResultLineError::Inconsistent {
            status,
            sha256: hash.to_string(),
        });
    }
    Ok(LinuxBuildResult {
        real_s,
        user_s,
        sys_s,
        status,
        sha256,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn line(fields: &str) -> String {
        format!("{RESULT_MARKER} {fields}")
    }

    #[test]
    fn reads_a_successful_build() {
        let r = parse_result_line(&line(&format!(
            "real=612.40 user=1150.22 sys=98.10 status=0 sha256={HASH}"
        )))
        .unwrap();
        assert_eq!(
            r,
            LinuxBuildResult {
                real_s: 612.40,
                user_s: 1150.22,
                sys_s: 98.10,
                status: 0,
                sha256: Some(HASH.into()),
            }
        );
        assert_eq!(r.checksum(), 0x9f86_d081_884c_7d65);
    }

    /// The console of a Linux guest that booted the image under the
    /// emulated host and built `init/` (its /pagefold-build-init's lines,
    /// as printed).
    #[test]
    fn reads_what_the_images_init_printed() {
        let console = "pagefold initrd: switching to /dev/vda (rw), /pagefold-build-init\n\
            pagefold-build: 6.1.0-57-cloud-amd64, 1 CPUs, 996756 kB\n\
            PAGEFOLD-BUILD-START nproc=1 targets=init/\n\
            pagefold-build: 3 objects compiled\n\
            PAGEFOLD-BUILD-RESULT real=82.77 user=52.42 sys=21.77 status=0 \
            sha256=b83f5b4665433dc28804de628c0e67835b021055895687f634ef005436e95c95\n";
        let line = console.lines().find(|l| l.contains(RESULT_MARKER)).unwrap();
        let r = parse_result_line(line).unwrap();
        assert_eq!(
            (r.real_s, r.user_s, r.sys_s, r.status),
            (82.77, 52.42, 21.77, 0)
        );
        assert_eq!(r.checksum(), 0xb83f_5b46_6543_3dc2);
    }

    #[test]
    fn reads_a_failed_build_and_any_field_order() {
        let r = parse_result_line(&line("status=2 sha256=- sys=1 user=30 real=12")).unwrap();
        assert_eq!((r.status, r.sha256.as_deref()), (2, None));
        assert_eq!((r.real_s, r.user_s, r.sys_s), (12.0, 30.0, 1.0));
        assert_eq!(r.checksum(), 0);
        // A hand-made result with a short hash has no checksum (no panic).
        let short = LinuxBuildResult {
            sha256: Some("abc".into()),
            ..r
        };
        assert_eq!(short.checksum(), 0);
    }

    #[test]
    fn tolerates_console_noise_around_the_line() {
        let r = parse_result_line(&format!(
            "[  700.1] random: crng init done\x1b[0m{RESULT_MARKER}  real=1.5 user=2 sys=0.25 status=0 sha256={HASH} \r"
        ))
        .unwrap();
        assert_eq!(r.real_s, 1.5);
        assert_eq!(r.sha256.as_deref(), Some(HASH));
    }

    #[test]
    fn refuses_malformed_lines() {
        use ResultLineError::*;
        let ok = format!("real=1 user=2 sys=3 status=0 sha256={HASH}");
        assert_eq!(parse_result_line("real=1 user=2"), Err(NoMarker));
        assert_eq!(parse_result_line(""), Err(NoMarker));
        // The marker must stand alone, not be a prefix of another word.
        assert_eq!(
            parse_result_line(&format!("{RESULT_MARKER}X {ok}")),
            Err(NoMarker)
        );
        assert_eq!(parse_result_line(RESULT_MARKER), Err(Missing("real")));
        assert_eq!(
            parse_result_line(&line(&format!("real=1 user=2 status=0 sha256={HASH}"))),
            Err(Missing("sys"))
        );
        assert_eq!(
            parse_result_line(&line("real=1 user=2 sys=3 status=0")),
            Err(Missing("sha256"))
        );
        assert_eq!(
            parse_result_line(&line(&format!("{ok} real=4"))),
            Err(Duplicate("real".into()))
        );
        assert_eq!(
            parse_result_line(&line(&format!("{ok} cpus=2"))),
            Err(Unknown("cpus".into()))
        );
        assert_eq!(
            parse_result_line(&line(&format!("{ok} trailing"))),
            Err(Unknown("trailing".into()))
        );
        for bad_time in [
            "", "-1", "1e3", "inf", "NaN", "1.2.3", ".", "0:10.5", "1m2s",
        ] {
            let l = line(&format!(
                "real={bad_time} user=2 sys=3 status=0 sha256={HASH}"
            ));
            assert!(
                matches!(parse_result_line(&l), Err(Malformed { key: "real", .. })),
                "{l}: {:?}",
                parse_result_line(&l)
            );
        }
        for bad_status in ["-1", "256", "+0", "ok", ""] {
            let l = line(&format!("real=1 user=2 sys=3 status={bad_status} sha256=-"));
            assert!(
                matches!(parse_result_line(&l), Err(Malformed { key: "status", .. })),
                "{l}"
            );
        }
        for bad_hash in [&HASH[1..], &HASH.to_uppercase(), "zz", &format!("{HASH}0")] {
            let l = line(&format!("real=1 user=2 sys=3 status=0 sha256={bad_hash}"));
            assert!(
                matches!(parse_result_line(&l), Err(Malformed { key: "sha256", .. })),
                "{l}"
            );
        }
        assert!(matches!(
            parse_result_line(&line("real=1 user=2 sys=3 status=0 sha256=-")),
            Err(Inconsistent { status: 0, .. })
        ));
        assert!(matches!(
            parse_result_line(&line(&format!(
                "real=1 user=2 sys=3 status=2 sha256={HASH}"
            ))),
            Err(Inconsistent { status: 2, .. })
        ));
    }
}
