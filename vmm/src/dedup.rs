//! Creates the process's dedup backend from the config: pagefold's own
//! engine or the kernel's KSM, each optionally steered by the auto-mode
//! controller (merge only while host memory is short).

use std::sync::Arc;

use pagefold_dedup::auto::{AutoConfig, AutoController, AutoHandle, MemorySource, ProcMemSource};
use pagefold_dedup::ksm::{KsmBackend, KsmOptions};
use pagefold_dedup::{
    BackendKind, DedupBackend, Engine, EngineConfig, Mode, DEFAULT_KNOBS, DEFAULT_QUIESCE_MIN_OPS,
};

use crate::config::Config;

/// Errors creating a backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("dedup backend {backend}: {message}")]
    Backend { backend: String, message: String },
    #[error("dedup: {0}")]
    Config(String),
}

/// A backend and, when it has one, its auto-mode controller's handle.
#[derive(Clone)]
pub struct Dedup {
    pub backend: Arc<dyn DedupBackend>,
    pub auto: Option<AutoHandle>,
}

/// The environment variable that overrides the engine's quiesce threshold
/// ([`EngineConfig::quiesce_min_ops`]; 0: never park the vCPUs) in the VMM
/// and the benchmarks, for side-by-side measurements.
pub const QUIESCE_MIN_OPS_ENV: &str = "PAGEFOLD_QUIESCE_MIN_OPS";

/// The quiesce threshold for an engine this process creates:
/// [`QUIESCE_MIN_OPS_ENV`] when it is set, else the engine's default. A
/// value that is not a whole number is reported and ignored: the knob only
/// serves measurements, and a typo must not stop the VMs.
pub fn quiesce_min_ops() -> usize {
    match std::env::var(QUIESCE_MIN_OPS_ENV) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            log::warn!(
                "{QUIESCE_MIN_OPS_ENV}={v:?} is not a whole number; using {DEFAULT_QUIESCE_MIN_OPS}"
            );
            DEFAULT_QUIESCE_MIN_OPS
        }),
        Err(std::env::VarError::NotPresent) => DEFAULT_QUIESCE_MIN_OPS,
        Err(e) => {
            log::warn!("{QUIESCE_MIN_OPS_ENV}: {e}; using {DEFAULT_QUIESCE_MIN_OPS}");
            DEFAULT_QUIESCE_MIN_OPS
        }
    }
}

fn backend_err(backend: BackendKind, e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: backend.to_string(),
        message: e.to_string(),
    }
}

/// The backends' threads' start hook: their seccomp filters, when filters
/// are on (the engine's scanner and fault handler, the KSM backend's
/// auto-mode driver). A thread that cannot install its filter ends the
/// process (it must not run unfiltered, and has nobody to report to).
fn thread_init() -> Option<pagefold_dedup::ThreadInit> {
    use crate::seccomp::{self, ThreadKind};
    use pagefold_dedup::DedupThread;
    if !seccomp::enabled() {
        return None;
    }
    Some(pagefold_dedup::ThreadInit(Arc::new(|t| {
        let kind = match t {
            DedupThread::Scanner => ThreadKind::Engine,
            DedupThread::FaultHandler => ThreadKind::Fault,
            DedupThread::KsmDriver => ThreadKind::Ksm,
        };
        if let Err(e) = seccomp::install(kind) {
            log::error!("{e}");
            std::process::exit(3);
        }
    })))
}

/// Creates the backend for `cfg`. Without any VM that wants dedup, and
/// unless `always` (the API may switch dedup on later), there is none.
pub fn create(cfg: &Config, always: bool) -> Result<Option<Dedup>, Error> {
    create_backend_with_source(cfg, always, None)
}

/// The backend alone, created whenever some VM has dedup enabled (so that
/// the API can switch modes at run time).
pub fn create_backend(cfg: &Config) -> Result<Option<Arc<dyn DedupBackend>>, Error> {
    let any = cfg.vms.iter().any(|v| v.dedup.enabled);
    Ok(create(cfg, any)?.map(|d| d.backend))
}

/// As [`create_backend`], with the auto controller reading `source`
/// instead of `/proc/meminfo` (tests and benchmarks script it).
pub fn create_backend_with_source(
    cfg: &Config,
    always: bool,
    source: Option<Box<dyn MemorySource>>,
) -> Result<Option<Dedup>, Error> {
    let d = &cfg.dedup;
    let wanted = cfg.vms.iter().any(|v| v.dedup.enabled) && d.mode() != Mode::Off;
    if !wanted && !always {
        return Ok(None);
    }
    let settings = &d.settings;
    let auto = AutoConfig::default().overlaid(settings);
    let source = source.unwrap_or_else(|| Box::new(ProcMemSource::new()));
    let (backend, handle): (Arc<dyn DedupBackend>, AutoHandle) = match d.backend {
        BackendKind::Pagefold => {
            let engine = Engine::new(EngineConfig {
                mode: Mode::Off,
                assist: pagefold_dedup::AssistConfig {
                    mode: d.ksm_assist,
                    ..Default::default()
                },
                io_hints: d.io_hints,
                write_log: d.write_log,
                thread_init: thread_init(),
                quiesce_min_ops: quiesce_min_ops(),
                ..EngineConfig::default()
            })
            .map_err(|e| backend_err(d.backend, e))?;
            // The controller is installed before the mode is set: auto mode
            // never runs a wake-up without it.
            let pages_to_scan = settings.knobs_over(DEFAULT_KNOBS).pages_to_scan;
            let ctl = AutoController::new(auto, source, pages_to_scan)
                .map_err(|e| Error::Config(e.to_string()))?;
            let handle = ctl.handle();
            engine.set_round_policy(Box::new(ctl));
            (Arc::new(engine), handle)
        }
        BackendKind::Ksm => {
            let ksm = KsmBackend::with_options(KsmOptions {
                auto,
                memory_source: Some(source),
                thread_init: thread_init(),
                ..KsmOptions::default()
            })
            .map_err(|e| backend_err(d.backend, e))?;
            let handle = ksm.auto_handle();
            (Arc::new(ksm), handle)
        }
    };
    backend
        .apply(settings)
        .map_err(|e| backend_err(d.backend, e))?;
    Ok(Some(Dedup {
        backend,
        auto: Some(handle),
    }))
}
