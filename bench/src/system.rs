//! The systems a benchmark compares: a name, a backend factory and knobs.
//! Generic over [`DedupBackend`]: kernel KSM and pagefold's engine run
//! through the same trait, side by side in one run.

use pagefold_dedup::ksm::KsmBackend;
use pagefold_dedup::{DedupBackend, DedupSettings, Engine, EngineConfig};

use crate::error::BenchError;

/// Builds a fresh backend for one run.
pub type BackendFactory =
    Box<dyn Fn() -> Result<Box<dyn DedupBackend>, pagefold_dedup::Error> + Send + Sync>;

/// One column of the comparison.
pub struct System {
    pub name: String,
    /// Knobs applied before the run; `None` keeps the backend's defaults.
    pub knobs: Option<DedupSettings>,
    pub factory: BackendFactory,
    /// Drives the host's kernel KSM (global knobs; checked for pollution).
    pub kernel_ksm: bool,
    /// Measure steady-state CPU after convergence (the goal compares the
    /// two default settings; max-effort settings skip the extra wait).
    pub measure_steady: bool,
}

/// KSM's defaults, set explicitly so a host with other values still
/// measures "default KSM". Not the engine's defaults
/// ([`pagefold_dedup::DEFAULT_KNOBS`], 4096 pages / 20 ms).
pub const KSM_DEFAULT_KNOBS: DedupSettings = DedupSettings {
    pages_to_scan: Some(100),
    sleep_millisecs: Some(20),
    ..DedupSettings::NONE
};

/// KSM at max effort: 10,000 pages per batch, no sleep.
pub const MAX_KNOBS: DedupSettings = DedupSettings {
    pages_to_scan: Some(10_000),
    sleep_millisecs: Some(0),
    ..DedupSettings::NONE
};

/// Names accepted by [`select_systems`], in run order.
pub const SYSTEM_NAMES: [&str; 4] = ["ksm-default", "ksm-max", "pagefold-default", "pagefold-max"];

/// The engine as the VMM runs it, inside a benchmark run that holds the
/// KSM lock for its whole length (so the KSM assist may use KSM).
pub fn engine_config_locked() -> EngineConfig {
    let mut c = EngineConfig::vmm_default();
    c.assist.lock_held = true;
    c.quiesce_min_ops = pagefold_vmm::dedup::quiesce_min_ops();
    c
}

/// pagefold's engine exactly as the VMM creates it by default.
pub fn engine_factory() -> BackendFactory {
    Box::new(|| {
        let e = Engine::new(engine_config_locked()).map_err(pagefold_dedup::Error::from)?;
        Ok(Box::new(e) as Box<dyn DedupBackend>)
    })
}

impl System {
    pub fn ksm_default() -> Self {
        Self::ksm("ksm-default", KSM_DEFAULT_KNOBS, true)
    }

    pub fn ksm_max() -> Self {
        Self::ksm("ksm-max", MAX_KNOBS, false)
    }

    fn ksm(name: &str, knobs: DedupSettings, measure_steady: bool) -> Self {
        Self {
            name: name.into(),
            knobs: Some(knobs),
            factory: Box::new(|| {
                Ok(
                    Box::new(KsmBackend::new().map_err(pagefold_dedup::Error::from)?)
                        as Box<dyn DedupBackend>,
                )
            }),
            kernel_ksm: true,
            measure_steady,
        }
    }

    /// pagefold's engine with its own default knobs (`DEFAULT_KNOBS`).
    pub fn pagefold_default(factory: BackendFactory) -> Self {
        Self {
            name: "pagefold-default".into(),
            knobs: None,
            factory,
            kernel_ksm: false,
            measure_steady: true,
        }
    }

    /// pagefold's engine at the same max-effort knobs as `ksm-max`.
    pub fn pagefold_max(factory: BackendFactory) -> Self {
        Self {
            name: "pagefold-max".into(),
            knobs: Some(MAX_KNOBS),
            factory,
            kernel_ksm: false,
            measure_steady: false,
        }
    }

    pub(crate) fn build(&self) -> Result<Box<dyn DedupBackend>, BenchError> {
        (self.factory)().map_err(BenchError::backend(&self.name))
    }
}

/// `ksm-default` and `ksm-max`.
pub fn ksm_systems() -> Vec<System> {
    vec![System::ksm_default(), System::ksm_max()]
}

/// All four systems, pagefold's built by [`engine_factory`].
pub fn all_systems() -> Vec<System> {
    vec![
        System::ksm_default(),
        System::ksm_max(),
        System::pagefold_default(engine_factory()),
        System::pagefold_max(engine_factory()),
    ]
}

/// The systems named in `names` (see [`SYSTEM_NAMES`]), in run order;
/// empty `names` means all.
pub fn select_systems(names: &[String]) -> Result<Vec<System>, BenchError> {
    if let Some(bad) = names.iter().find(|n| !SYSTEM_NAMES.contains(&n.as_str())) {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: SYSTEM_NAMES.join(", "),
        });
    }
    Ok(all_systems()
        .into_iter()
        .filter(|s| names.is_empty() || names.contains(&s.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_by_name_in_run_order() {
        let names = vec!["pagefold-max".to_string(), "ksm-default".to_string()];
        let s = select_systems(&names).unwrap();
        let got: Vec<_> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(got, ["ksm-default", "pagefold-max"]);
        assert_eq!(select_systems(&[]).unwrap().len(), 4);
        let e = select_systems(&["ksm-turbo".to_string()]).err().unwrap();
        assert!(e.to_string().contains("ksm-turbo"), "{e}");
    }

    #[test]
    fn pagefold_default_keeps_the_engines_own_knobs() {
        let s = System::pagefold_default(engine_factory());
        assert_eq!(s.knobs, None);
        assert_ne!(
            Some(pagefold_dedup::DEFAULT_KNOBS.pages_to_scan),
            KSM_DEFAULT_KNOBS.pages_to_scan
        );
    }
}
