//! Client and admin keys, compared in constant time, and the header hygiene
//! of requests entering kvgate.

use axum::http::{HeaderMap, HeaderName};
use subtle::ConstantTimeEq;

/// Whether `presented` equals one of `keys`, in time independent of where
/// they differ (every key is compared).
pub(crate) fn key_matches(keys: &[String], presented: &str) -> bool {
    let mut ok = subtle::Choice::from(0u8);
    for k in keys {
        // `ct_eq` on slices of different lengths is false without early exit
        // over the contents; the lengths of keys are not secret.
        ok |= k.as_bytes().ct_eq(presented.as_bytes());
    }
    bool::from(ok)
}

/// The bearer token of `Authorization: Bearer T`.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    bearer_of(headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?)
}

/// The token of an `Authorization` value `Bearer T` (the scheme in any case).
pub(crate) fn bearer_of(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Client requests are allowed when no keys are configured or a key matches.
pub(crate) fn client_allowed(keys: &[String], headers: &HeaderMap) -> bool {
    client_token_allowed(keys, bearer(headers))
}

/// The same for a bearer token found elsewhere (the endpoint picker reads
/// the client's headers from the gateway's message).
pub(crate) fn client_token_allowed(keys: &[String], token: Option<&str>) -> bool {
    keys.is_empty() || token.is_some_and(|t| key_matches(keys, t))
}

/// The admin key from `x-kvgate-admin-key` or `Authorization: Bearer`.
pub(crate) fn admin_allowed(key: Option<&String>, headers: &HeaderMap) -> bool {
    let Some(key) = key else { return true };
    let keys = std::slice::from_ref(key);
    let header = headers.get("x-kvgate-admin-key").and_then(|v| v.to_str().ok());
    header.or_else(|| bearer(headers)).is_some_and(|t| key_matches(keys, t))
}

/// Whether the request carries an admin key at all (either header form).
pub(crate) fn admin_key_presented(headers: &HeaderMap) -> bool {
    headers.contains_key("x-kvgate-admin-key") || bearer(headers).is_some()
}

/// The value of cookie `name` in the request's `Cookie` headers (the first
/// one, if a client sent it twice).
pub(crate) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) never travel to an engine.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The client headers forwarded to an engine: an allow-list, so that the
/// client's own credentials, hop-by-hop and `x-kvgate-*` headers never reach
/// it. kvgate sets `content-type` and the engine's key itself.
pub(crate) fn forwarded(headers: &HeaderMap) -> Vec<(HeaderName, axum::http::HeaderValue)> {
    const ALLOWED: [&str; 4] = ["accept", "x-request-id", "traceparent", "tracestate"];
    headers
        .iter()
        .filter(|(n, _)| {
            let n = n.as_str();
            ALLOWED.contains(&n) && !HOP_BY_HOP.contains(&n) && !n.starts_with("x-kvgate-")
        })
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let keys = vec!["key-one-123".to_string(), "key-two-456".to_string()];
        assert!(key_matches(&keys, "key-two-456"));
        assert!(!key_matches(&keys, "key-two-45"));
        assert!(!key_matches(&keys, "key-two-4567"));
        assert!(!key_matches(&keys, ""));
        assert!(!key_matches(&[], "x"));
    }

    #[test]
    fn bearer_and_admin_headers() {
        let mut h = HeaderMap::new();
        assert!(client_allowed(&[], &h));
        assert!(!client_allowed(&["sekrit-key".into()], &h));
        h.insert("authorization", "bearer sekrit-key".parse().unwrap());
        assert!(client_allowed(&["sekrit-key".into()], &h));
        assert!(!admin_allowed(Some(&"admin-key-1".into()), &h));
        h.insert("x-kvgate-admin-key", "admin-key-1".parse().unwrap());
        assert!(admin_allowed(Some(&"admin-key-1".into()), &h));
        assert!(admin_allowed(None, &HeaderMap::new()));
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut h = HeaderMap::new();
        assert_eq!(cookie(&h, "a"), None);
        h.append("cookie", "xa=1; a=two; b=3".parse().unwrap());
        h.append("cookie", "c=4".parse().unwrap());
        assert_eq!(cookie(&h, "a"), Some("two"));
        assert_eq!(cookie(&h, "c"), Some("4"));
        assert_eq!(cookie(&h, "x"), None);
        assert_eq!(cookie(&h, "A"), None);
    }

    #[test]
    fn only_allow_listed_headers_are_forwarded() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer client"),
            ("connection", "close"),
            ("x-kvgate-replica", "r0"),
            ("x-request-id", "abc"),
            ("cookie", "c=1"),
        ] {
            h.insert(HeaderName::from_static(k), v.parse().unwrap());
        }
        let names: Vec<_> = forwarded(&h).into_iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(names, ["x-request-id"]);
    }
}
