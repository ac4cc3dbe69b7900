//! The systems a benchmark compares: a name, a backend factory and knobs.
//! Generic over [`DedupBackend`]: kernel KSM and pagefold's engine run
//! through the same trait, side by side in one run.

use pagefold_dedup::ksm::KsmBackend;
use pagefold_dedup::{DedupBackend, KnobUpdate};

use crate::error::BenchError;

/// Builds a fresh backend for one run.
pub type BackendFactory =
    Box<dyn Fn() -> Result<Box<dyn DedupBackend>, pagefold_dedup::Error> + Send + Sync>;

/// One column of the comparison.
pub struct System {
    pub name: String,
    /// Knobs applied before the run; `None` keeps the backend's defaults.
    pub knobs: Option<KnobUpdate>,
    pub factory: BackendFactory,
    /// Drives the host's kernel KSM (global knobs; checked for pollution).
    pub kernel_ksm: bool,
}

/// KSM's defaults, set explicitly so a host with other values still
/// measures "default KSM".
pub const DEFAULT_KNOBS: KnobUpdate = KnobUpdate {
    pages_to_scan: Some(100),
    sleep_millisecs: Some(20),
    max_page_sharing: None,
};

/// The max-effort setting of ksm-baseline.md.
pub const MAX_KNOBS: KnobUpdate = KnobUpdate {
    pages_to_scan: Some(10_000),
    sleep_millisecs: Some(0),
    max_page_sharing: None,
};

impl System {
    pub fn ksm_default() -> Self {
        Self::ksm("ksm-default", DEFAULT_KNOBS)
    }

    pub fn ksm_max() -> Self {
        Self::ksm("ksm-max", MAX_KNOBS)
    }

    fn ksm(name: &str, knobs: KnobUpdate) -> Self {
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
        }
    }

    /// pagefold's engine with its own default knobs.
    pub fn pagefold_default(factory: BackendFactory) -> Self {
        Self {
            name: "pagefold-default".into(),
            knobs: None,
            factory,
            kernel_ksm: false,
        }
    }

    /// pagefold's engine at the same max-effort knobs as `ksm-max`.
    pub fn pagefold_max(factory: BackendFactory) -> Self {
        Self {
            name: "pagefold-max".into(),
            knobs: Some(MAX_KNOBS),
            factory,
            kernel_ksm: false,
        }
    }

    pub(crate) fn build(&self) -> Result<Box<dyn DedupBackend>, BenchError> {
        (self.factory)().map_err(|source| BenchError::Backend {
            system: self.name.clone(),
            source,
        })
    }
}

/// `ksm-default` and `ksm-max`.
pub fn ksm_systems() -> Vec<System> {
    vec![System::ksm_default(), System::ksm_max()]
}

/// All four systems; `engine` builds pagefold's engine (called per run).
pub fn all_systems(
    engine: impl Fn() -> Result<Box<dyn DedupBackend>, pagefold_dedup::Error>
        + Send
        + Sync
        + Clone
        + 'static,
) -> Vec<System> {
    vec![
        System::ksm_default(),
        System::ksm_max(),
        System::pagefold_default(Box::new(engine.clone())),
        System::pagefold_max(Box::new(engine)),
    ]
}
