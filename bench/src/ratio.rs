//! Ratios and goal checks shared by both benchmarks' reports.

use std::fmt::Write as _;

/// `a / b`, when both are known and `b` is positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// `2.50x` or `-`.
pub fn fmt_ratio(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}x")).unwrap_or_else(|| "-".into())
}

/// One goal of the project, judged against a measured value.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Goal {
    pub name: String,
    pub value: Option<f64>,
    /// e.g. `>= 20` or `<= 0.5`.
    pub target: String,
    /// `None` when the value could not be measured (e.g. not converged).
    pub met: Option<bool>,
    pub note: String,
}

impl Goal {
    pub fn at_least(name: String, value: Option<f64>, min: f64, note: String) -> Goal {
        Goal {
            name,
            value,
            target: format!(">= {min}"),
            met: value.map(|v| v >= min),
            note,
        }
    }

    pub fn at_most(name: String, value: Option<f64>, max: f64, note: String) -> Goal {
        Goal {
            name,
            value,
            target: format!("<= {max}"),
            met: value.map(|v| v <= max),
            note,
        }
    }

    /// "every system's {what} (share of systems)": the share of `rows`
    /// for which `ok` holds must be 1. None without rows.
    pub fn every_system<T>(what: &str, rows: &[T], ok: impl Fn(&T) -> bool) -> Option<Goal> {
        if rows.is_empty() {
            return None;
        }
        let agree = rows.iter().filter(|r| ok(r)).count();
        Some(Goal::at_least(
            format!("every system's {what} (share of systems)"),
            Some(agree as f64 / rows.len() as f64),
            1.0,
            String::new(),
        ))
    }

    /// `[met] name: 41.20 (goal >= 20); note`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "[{}] {}: {} (goal {})",
            match self.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            },
            self.name,
            self.value
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into()),
            self.target
        );
        if !self.note.is_empty() {
            let _ = write!(s, "; {}", self.note);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_needs_both_and_a_positive_divisor() {
        assert_eq!(ratio(Some(1.0), Some(4.0)), Some(0.25));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        assert_eq!(fmt_ratio(Some(41.234)), "41.23x");
        assert_eq!(fmt_ratio(None), "-");
    }

    #[test]
    fn goals_compare_inclusively() {
        assert_eq!(
            Goal::at_least("a".into(), Some(20.0), 20.0, "".into()).met,
            Some(true)
        );
        assert_eq!(
            Goal::at_least("a".into(), Some(19.9), 20.0, "".into()).met,
            Some(false)
        );
        assert_eq!(
            Goal::at_most("b".into(), Some(0.5), 0.5, "".into()).met,
            Some(true)
        );
        assert_eq!(
            Goal::at_most("b".into(), Some(0.51), 0.5, "".into()).met,
            Some(false)
        );
        let g = Goal::at_most("c".into(), None, 1.0, "why".into());
        assert_eq!(g.met, None);
        assert_eq!(g.line(), "[not measured] c: - (goal <= 1); why");
    }
}
