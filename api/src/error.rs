//! Errors as HTTP answers: every failure leaves the server as a JSON body
//! `{"error": "..."}` with a status that tells the client whose fault it is.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pagefold_vmm::control::RequestError;

use crate::view::ErrorBody;

/// Why a request failed, with the HTTP status each maps to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed or invalid input.
    #[error("{0}")]
    BadRequest(String),
    /// 404: no such route or object.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists, the method does not.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 408: the client was too slow sending its body.
    #[error("{0}")]
    Timeout(String),
    /// 409: the request conflicts with the current state.
    #[error("{0}")]
    Conflict(String),
    /// 413: the body is larger than the limit.
    #[error("request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
    /// 500: a bug or an unexpected failure inside pagefold.
    #[error("{0}")]
    Internal(String),
    /// 503: the VMM is shutting down.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        let msg = e.to_string();
        match e {
            RequestError::BadRequest(_) => ApiError::BadRequest(msg),
            RequestError::NotFound(_) => ApiError::NotFound(msg),
            RequestError::Conflict(_) => ApiError::Conflict(msg),
            RequestError::Internal(_) => ApiError::Internal(msg),
            RequestError::Gone => ApiError::Unavailable(msg),
        }
    }
}

impl From<pagefold_dedup::Error> for ApiError {
    fn from(e: pagefold_dedup::Error) -> Self {
        use pagefold_dedup::Error as E;
        let msg = e.to_string();
        match e {
            E::Settings(_) => ApiError::BadRequest(msg),
            E::Unsupported(_) => ApiError::Conflict(msg),
            _ => ApiError::Internal(msg),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            log::warn!("API: {self}");
        }
        let body = ErrorBody {
            error: self.to_string(),
        };
        (self.status(), axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_errors_map_to_statuses() {
        let cases = [
            (RequestError::BadRequest("x".into()), 400),
            (RequestError::NotFound("vm9".into()), 404),
            (RequestError::Conflict("x".into()), 409),
            (RequestError::Internal("x".into()), 500),
            (RequestError::Gone, 503),
        ];
        for (e, code) in cases {
            assert_eq!(ApiError::from(e).status().as_u16(), code);
        }
        assert_eq!(
            ApiError::from(RequestError::NotFound("vm9".into())).to_string(),
            "no VM named \"vm9\""
        );
    }

    #[test]
    fn backend_errors_map_to_statuses() {
        let e = pagefold_dedup::Error::from(pagefold_dedup::SettingsError::OutOfRange {
            name: "pages_to_scan",
            value: 0,
            min: 1,
            max: 9,
        });
        let a = ApiError::from(e);
        assert_eq!(a.status(), StatusCode::BAD_REQUEST);
        assert!(a.to_string().contains("pages_to_scan"), "{a}");
        let u = ApiError::from(pagefold_dedup::Error::Unsupported("no".into()));
        assert_eq!(u.status(), StatusCode::CONFLICT);
    }
}
