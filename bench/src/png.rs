//! SVG to PNG with `rsvg-convert` (Debian's librsvg2-bin), when installed:
//! a PNG renders in places an SVG does not (some viewers, chat, issues).

use std::process::Command;

use crate::error::BenchError;

/// Writes `svg_path` with the extension `.png` beside it and returns its
/// path; `Ok(None)` when `rsvg-convert` is not installed.
pub fn svg_to_png(svg_path: &str) -> Result<Option<String>, BenchError> {
    let png = png_path(svg_path);
    let out = match Command::new("rsvg-convert")
        .args(["-f", "png", "-o", &png, svg_path])
        .output()
    {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(BenchError::Png {
                path: svg_path.into(),
                message: e.to_string(),
            })
        }
    };
    if !out.status.success() {
        return Err(BenchError::Png {
            path: svg_path.into(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(Some(png))
}

/// `x.svg` -> `x.png`; any other name gets `.png` appended.
pub fn png_path(svg_path: &str) -> String {
    match svg_path.strip_suffix(".svg") {
        Some(stem) => format!("{stem}.png"),
        None => format!("{svg_path}.png"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_names() {
        assert_eq!(png_path("docs/results/auto.svg"), "docs/results/auto.png");
        assert_eq!(png_path("plot"), "plot.png");
    }

    #[test]
    fn converts_a_rendered_chart_to_a_real_png() {
        let dir = std::env::temp_dir().join(format!("pagefold-bench-png-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("c.svg");
        let p = crate::svg::Panel {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: true,
            lines: vec![crate::svg::Line {
                name: "a".into(),
                points: vec![(0.1, 1.0), (10.0, 5.0)],
            }],
        };
        std::fs::write(&svg, crate::svg::render(&[p])).unwrap();
        let got = svg_to_png(svg.to_str().unwrap()).unwrap();
        // rsvg-convert is installed on the project's machines.
        let png = std::fs::read(got.expect("rsvg-convert missing")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
