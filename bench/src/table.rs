//! One table, two renderings: aligned plain text for the terminal and a
//! markdown table for docs/results. A report fills the cells once, so
//! the two cannot drift apart (a column added to one and not the other).

/// A column: its short name in plain text, its long name in markdown.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// Plain-text header (one word, the JSON field's name where there is
    /// one).
    pub short: &'static str,
    /// Markdown header (words, with the unit).
    pub long: &'static str,
}

/// Rows of formatted cells under fixed columns.
#[derive(Debug, Clone)]
pub struct Table {
    cols: Vec<Column>,
    /// The first `left` columns are names (left-aligned in plain text);
    /// the rest are figures (right-aligned).
    left: usize,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table of `cols`, the first `left` of them names.
    pub fn new(cols: &[Column], left: usize) -> Table {
        Table {
            cols: cols.to_vec(),
            left,
            rows: Vec::new(),
        }
    }

    /// Appends a row: one cell per column (missing cells are empty, extra
    /// ones dropped, so a slip shows in the output instead of a panic).
    pub fn row(&mut self, mut cells: Vec<String>) {
        cells.resize(self.cols.len(), String::new());
        self.rows.push(cells);
    }

    /// Plain text, one line per row under a header line, each column as
    /// wide as its widest cell, one space between columns, no trailing
    /// spaces.
    pub fn text(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.cols[i].short.chars().count()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.cols.len()).map(width).collect();
        let line = |cells: Vec<&str>| {
            let mut out = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let pad = widths[i].saturating_sub(c.chars().count());
                if i < self.left {
                    out.push_str(c);
                    out.extend(std::iter::repeat_n(' ', pad));
                } else {
                    out.extend(std::iter::repeat_n(' ', pad));
                    out.push_str(c);
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
            out
        };
        let mut out = line(self.cols.iter().map(|c| c.short).collect());
        for r in &self.rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        out
    }

    /// A markdown table: the long headers, a rule, one line per row.
    pub fn markdown(&self) -> String {
        let line = |cells: Vec<&str>| format!("| {} |\n", cells.join(" | "));
        let mut out = line(self.cols.iter().map(|c| c.long).collect());
        out.push_str(&format!("|{}\n", "---|".repeat(self.cols.len())));
        for r in &self.rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLS: [Column; 3] = [
        Column {
            short: "system",
            long: "system",
        },
        Column {
            short: "p99_us",
            long: "p99 (µs)",
        },
        Column {
            short: "note",
            long: "note",
        },
    ];

    fn table() -> Table {
        let mut t = Table::new(&COLS, 1);
        t.row(vec!["off".into(), "12".into(), String::new()]);
        t.row(vec!["pagefold-on".into(), "1234567".into(), "late".into()]);
        t
    }

    #[test]
    fn text_aligns_names_left_and_figures_right() {
        assert_eq!(
            table().text(),
            "system       p99_us note\n\
             off              12\n\
             pagefold-on 1234567 late\n"
        );
    }

    #[test]
    fn markdown_has_the_long_headers_a_rule_and_every_cell() {
        assert_eq!(
            table().markdown(),
            "| system | p99 (µs) | note |\n|---|---|---|\n| off | 12 |  |\n| pagefold-on | 1234567 | late |\n"
        );
    }

    #[test]
    fn a_short_row_is_padded_not_a_panic() {
        let mut t = Table::new(&COLS, 1);
        t.row(vec!["ksm".into()]);
        assert!(t.markdown().ends_with("| ksm |  |  |\n"));
        assert_eq!(t.text().lines().nth(1), Some("ksm"));
    }
}
