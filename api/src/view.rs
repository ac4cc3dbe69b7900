//! The small answers: errors, `/health` and `/shutdown`. One type per body,
//! shared by the handlers (which serialize them), the CLI (which reads
//! them) and the OpenAPI spec (which describes them), so the three cannot
//! disagree.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every error answer: `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    pub error: String,
}

/// `ok`, or `stalled` (HTTP 503) when the engine judges a scanner wake-up
/// overdue or its statistics do not answer within 2 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
    Stalled,
}

/// The `GET /health` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: HealthStatus,
    pub vms: usize,
    /// `pagefold` or `ksm`; null when deduplication is off.
    #[schema(required = true)]
    pub dedup_backend: Option<String>,
    /// The dedup engine's liveness; null without a backend.
    #[schema(required = true)]
    pub engine: Option<EngineHealth>,
}

impl Health {
    /// Stalled: the engine's statistics did not answer, or it judges a
    /// wake-up overdue.
    pub fn stalled(&self) -> bool {
        self.engine
            .as_ref()
            .is_some_and(|e| e.wakeup_overdue || !e.responding)
    }
}

/// The dedup engine's liveness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EngineHealth {
    pub backend: String,
    /// The backend's statistics answered within 2 s.
    pub responding: bool,
    /// Milliseconds since the scanner last woke up (0 when the backend does
    /// not know, e.g. KSM); null when the statistics did not answer.
    #[schema(required = true)]
    pub last_wakeup_age_ms: Option<u64>,
    /// The engine's own judgement that a wake-up is overdue (scanning is on,
    /// no wake-up within the planned sleep plus a grace period).
    pub wakeup_overdue: bool,
}

/// The one `status` a `PUT /shutdown` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ShuttingDown {
    #[serde(rename = "shutting down")]
    ShuttingDown,
}

/// The `PUT /shutdown` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Shutdown)]
pub struct ShutdownBody {
    pub status: ShuttingDown,
}

/// A `GET /health` 503 carries either body: Health when the engine is
/// stalled, Error when the VMM is shutting down.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum HealthOrError {
    Health(Health),
    Error(ErrorBody),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_serialize_as_documented() {
        let h = Health {
            status: HealthStatus::Stalled,
            vms: 2,
            dedup_backend: None,
            engine: None,
        };
        assert_eq!(
            serde_json::to_string(&h).unwrap(),
            r#"{"status":"stalled","vms":2,"dedup_backend":null,"engine":null}"#
        );
        let s = ShutdownBody {
            status: ShuttingDown::ShuttingDown,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"status":"shutting down"}"#
        );
    }

    #[test]
    fn stalled_means_overdue_or_silent() {
        let mut e = EngineHealth {
            backend: "pagefold".into(),
            responding: true,
            last_wakeup_age_ms: Some(5),
            wakeup_overdue: false,
        };
        let h = |e: &EngineHealth| Health {
            status: HealthStatus::Ok,
            vms: 0,
            dedup_backend: Some("pagefold".into()),
            engine: Some(e.clone()),
        };
        assert!(!h(&e).stalled());
        e.wakeup_overdue = true;
        assert!(h(&e).stalled());
        e.wakeup_overdue = false;
        e.responding = false;
        assert!(h(&e).stalled());
    }
}
