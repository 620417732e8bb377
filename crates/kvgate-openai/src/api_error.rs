//! The OpenAI error body, `{"error": {"message", "type", "param", "code"}}`,
//! and the HTTP status that goes with each kind of error.
//!
//! vLLM writes `code` as the HTTP status number while OpenAI writes a string
//! identifier (or `null`); [`ErrorCode`] reads both. Bodies built here carry
//! the status number, as vLLM's do, so clients see one shape whether an
//! error came from kvgate or from an engine. [`ErrorResponse::from_upstream`]
//! turns whatever an upstream sent (nested, vLLM's older flat form,
//! FastAPI's `{"detail": ...}`, or plain text) into this shape.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The kinds of error kvgate reports, each with its status and `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 400 `invalid_request_error`: the body is malformed or breaks a rule.
    InvalidRequest,
    /// 401 `authentication_error`: a missing or wrong API key.
    Authentication,
    /// 403 `permission_error`.
    PermissionDenied,
    /// 404 `not_found_error`: an unknown model or route.
    NotFound,
    /// 429 `rate_limit_error`: shed by admission control.
    RateLimited,
    /// 500 `server_error`: a bug or an unexpected state in kvgate.
    Internal,
    /// 502 `upstream_error`: the engine failed or answered nonsense.
    BadGateway,
    /// 503 `service_unavailable_error`: no healthy engine can take it.
    Unavailable,
    /// 504 `timeout_error`: the engine did not answer in time.
    Timeout,
}

impl ErrorKind {
    /// The HTTP status code.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::PermissionDenied => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::RateLimited => 429,
            ErrorKind::Internal => 500,
            ErrorKind::BadGateway => 502,
            ErrorKind::Unavailable => 503,
            ErrorKind::Timeout => 504,
        }
    }

    /// The body's `type` string.
    pub fn type_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::PermissionDenied => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Internal => "server_error",
            ErrorKind::BadGateway => "upstream_error",
            ErrorKind::Unavailable => "service_unavailable_error",
            ErrorKind::Timeout => "timeout_error",
        }
    }

    /// The kind for an HTTP status: exact where one matches, otherwise
    /// `InvalidRequest` for other 4xx and `Internal` for anything else.
    pub fn from_status(status: u16) -> ErrorKind {
        match status {
            401 => ErrorKind::Authentication,
            403 => ErrorKind::PermissionDenied,
            404 => ErrorKind::NotFound,
            429 => ErrorKind::RateLimited,
            502 => ErrorKind::BadGateway,
            503 => ErrorKind::Unavailable,
            504 => ErrorKind::Timeout,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Internal,
        }
    }

    /// The kind whose `type` string is `type_str`, also accepting vLLM's
    /// Python-style names (`BadRequestError`, `NotFoundError`, ...).
    pub fn from_type_str(type_str: &str) -> Option<ErrorKind> {
        Some(match type_str {
            "invalid_request_error" | "BadRequestError" | "BadRequest" => ErrorKind::InvalidRequest,
            "authentication_error" | "AuthenticationError" | "Unauthorized" => {
                ErrorKind::Authentication
            }
            "permission_error" | "PermissionDeniedError" => ErrorKind::PermissionDenied,
            "not_found_error" | "NotFoundError" | "NotFound" => ErrorKind::NotFound,
            "rate_limit_error" | "RateLimitError" => ErrorKind::RateLimited,
            "server_error" | "InternalServerError" => ErrorKind::Internal,
            "upstream_error" => ErrorKind::BadGateway,
            "service_unavailable_error" | "ServiceUnavailableError" => ErrorKind::Unavailable,
            "timeout_error" => ErrorKind::Timeout,
            _ => return None,
        })
    }
}

/// The `code` of an error: vLLM sends the status number, OpenAI a string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErrorCode {
    /// A number (vLLM: the HTTP status).
    Number(i64),
    /// A string identifier, e.g. `"model_not_found"`.
    Text(String),
}

/// The inner object of an error body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// What went wrong, for a human.
    pub message: String,
    /// The error class, e.g. `invalid_request_error`.
    #[serde(rename = "type", default)]
    pub error_type: String,
    /// The request field at fault.
    #[serde(default)]
    pub param: Option<String>,
    /// A machine-readable code.
    #[serde(default)]
    pub code: Option<ErrorCode>,
    /// Anything else an upstream put there.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An error body, `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorInfo,
}

/// Longest upstream text kept as a message when the body is not JSON.
const MAX_RAW_MESSAGE: usize = 1024;

impl ErrorResponse {
    /// An error of `kind`; `code` is the status number, as vLLM sends it.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::with_status(kind.status(), message)
    }

    /// An error for an arbitrary HTTP `status`; the `type` comes from
    /// [`ErrorKind::from_status`] and `code` is `status`.
    pub fn with_status(status: u16, message: impl Into<String>) -> Self {
        ErrorResponse {
            error: ErrorInfo {
                message: message.into(),
                error_type: ErrorKind::from_status(status).type_str().to_owned(),
                param: None,
                code: Some(ErrorCode::Number(i64::from(status))),
                extra: Map::new(),
            },
        }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// 401 `authentication_error`.
    pub fn authentication(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Authentication, message)
    }

    /// 403 `permission_error`.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// 404 `not_found_error`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// 429 `rate_limit_error`.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::RateLimited, message)
    }

    /// 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// 502 `upstream_error`.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadGateway, message)
    }

    /// 503 `service_unavailable_error`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// 504 `timeout_error`.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    /// Replaces `code`, e.g. with an OpenAI string code.
    pub fn with_code(mut self, code: ErrorCode) -> Self {
        self.error.code = Some(code);
        self
    }

    /// The HTTP status to send: `code` when it is a status number, else the
    /// status of the `type`, else 500.
    pub fn status(&self) -> u16 {
        if let Some(ErrorCode::Number(code)) = self.error.code {
            if let Ok(status @ 400..=599) = u16::try_from(code) {
                return status;
            }
        }
        ErrorKind::from_type_str(&self.error.error_type).map_or(500, ErrorKind::status)
    }

    /// The body as JSON bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        // Serialising strings, maps and numbers into memory cannot fail; the
        // fallback keeps that fact out of the signature.
        serde_json::to_vec(self).unwrap_or_else(|_| {
            br#"{"error":{"message":"error","type":"server_error","param":null,"code":500}}"#
                .to_vec()
        })
    }

    /// Normalises an upstream error answer with HTTP `status` and `body`:
    /// a proper error body is kept as is; vLLM's older flat body
    /// (`{"object": "error", "message": ...}`), FastAPI's `{"detail": ...}`,
    /// `{"error": "text"}` and non-JSON text become a message; a missing
    /// `code` becomes `status`.
    pub fn from_upstream(status: u16, body: &[u8]) -> Self {
        if let Ok(mut parsed) = serde_json::from_slice::<ErrorResponse>(body) {
            if parsed.error.code.is_none() {
                parsed.error.code = Some(ErrorCode::Number(i64::from(status)));
            }
            if parsed.error.error_type.is_empty() {
                parsed.error.error_type = ErrorKind::from_status(status).type_str().to_owned();
            }
            return parsed;
        }
        let value = serde_json::from_slice::<Value>(body).ok();
        let object = value.as_ref().and_then(Value::as_object);
        if let Some(object) = object {
            if let Ok(mut info) = serde_json::from_value::<ErrorInfo>(Value::Object(object.clone()))
            {
                info.extra.remove("object");
                if info.code.is_none() {
                    info.code = Some(ErrorCode::Number(i64::from(status)));
                }
                if info.error_type.is_empty() {
                    info.error_type = ErrorKind::from_status(status).type_str().to_owned();
                }
                return ErrorResponse { error: info };
            }
            for key in ["error", "detail", "message"] {
                match object.get(key) {
                    Some(Value::String(text)) => return Self::with_status(status, text.clone()),
                    Some(other @ (Value::Array(_) | Value::Object(_))) => {
                        return Self::with_status(status, other.to_string())
                    }
                    _ => {}
                }
            }
        }
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            return Self::with_status(status, format!("upstream returned status {status}"));
        }
        let mut cut = text.len().min(MAX_RAW_MESSAGE);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        Self::with_status(status, &text[..cut])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn constructors_map_to_status_and_type() {
        let cases = [
            (ErrorResponse::invalid_request("x"), 400, "invalid_request_error"),
            (ErrorResponse::authentication("x"), 401, "authentication_error"),
            (ErrorResponse::permission_denied("x"), 403, "permission_error"),
            (ErrorResponse::not_found("x"), 404, "not_found_error"),
            (ErrorResponse::rate_limited("x"), 429, "rate_limit_error"),
            (ErrorResponse::internal("x"), 500, "server_error"),
            (ErrorResponse::bad_gateway("x"), 502, "upstream_error"),
            (ErrorResponse::unavailable("x"), 503, "service_unavailable_error"),
            (ErrorResponse::timeout("x"), 504, "timeout_error"),
        ];
        for (body, status, type_str) in cases {
            assert_eq!(body.status(), status);
            assert_eq!(body.error.error_type, type_str);
            assert_eq!(ErrorKind::from_status(status).type_str(), type_str);
            assert_eq!(ErrorKind::from_type_str(type_str).map(ErrorKind::status), Some(status));
        }
    }

    #[test]
    fn body_has_the_openai_shape() {
        let body = ErrorResponse::not_found("the model `x` does not exist").with_param("model");
        let value: Value = serde_json::from_slice(&body.to_vec()).unwrap();
        assert_eq!(
            value,
            json!({"error": {
                "message": "the model `x` does not exist",
                "type": "not_found_error",
                "param": "model",
                "code": 404
            }})
        );
    }

    #[test]
    fn status_falls_back_to_type_then_500() {
        let mut body = ErrorResponse::rate_limited("slow down")
            .with_code(ErrorCode::Text("rate_limit_exceeded".into()));
        assert_eq!(body.status(), 429);
        body.error.error_type = "something_else".into();
        assert_eq!(body.status(), 500);
        assert_eq!(ErrorResponse::with_status(413, "too big").status(), 413);
        assert_eq!(
            ErrorResponse::with_status(413, "too big").error.error_type,
            "invalid_request_error"
        );
    }

    #[test]
    fn reads_openai_and_vllm_bodies() {
        let openai = br#"{"error":{"message":"bad key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
        let parsed = ErrorResponse::from_upstream(401, openai);
        assert_eq!(parsed.error.code, Some(ErrorCode::Text("invalid_api_key".into())));
        assert_eq!(parsed.status(), 400);

        let vllm =
            br#"{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}"#;
        let parsed = ErrorResponse::from_upstream(400, vllm);
        assert_eq!(parsed.status(), 400);
        assert_eq!(parsed.error.message, "too long");

        let flat = br#"{"object":"error","message":"old vllm","type":"BadRequestError","param":null,"code":400}"#;
        let parsed = ErrorResponse::from_upstream(400, flat);
        assert_eq!(parsed.error.message, "old vllm");
        assert!(parsed.error.extra.is_empty());

        let fastapi = br#"{"detail":"Not Found"}"#;
        let parsed = ErrorResponse::from_upstream(404, fastapi);
        assert_eq!(parsed.error.message, "Not Found");
        assert_eq!(parsed.status(), 404);
        assert_eq!(parsed.error.error_type, "not_found_error");

        let text = ErrorResponse::from_upstream(502, "<html>bad gateway</html>".as_bytes());
        assert_eq!(text.error.message, "<html>bad gateway</html>");
        assert_eq!(text.status(), 502);

        let empty = ErrorResponse::from_upstream(503, b"");
        assert_eq!(empty.error.message, "upstream returned status 503");

        let long = "é".repeat(2000);
        let cut = ErrorResponse::from_upstream(500, long.as_bytes());
        assert!(cut.error.message.len() <= MAX_RAW_MESSAGE);
    }
}
