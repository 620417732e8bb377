//! The ext_proc messages the endpoint picker reads and writes, built and
//! read here only: header values, the subset hint and the served endpoint
//! in the gateway's metadata, the routing answer (header, dynamic metadata,
//! route-cache clear), re-emitted body chunks, and pass-through answers.
//! Plain functions over the protobuf types, no I/O.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, HttpHeaders, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The header (and dynamic-metadata key) naming the chosen endpoints.
pub(crate) const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of the answer and of the served endpoint.
pub(crate) const LB_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace and key of the gateway's candidate subset.
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub(crate) const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The key under `envoy.lb` naming the endpoint that served the response.
pub(crate) const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";

/// Largest body chunk re-emitted to the gateway. Envoy's gRPC messages are
/// bounded; the reference picker uses 62,000 bytes, so a gateway configured
/// for it accepts these.
pub(crate) const BODY_CHUNK_BYTES: usize = 62_000;

/// ext_proc's `BodySendMode` values the picker distinguishes: bodies are
/// echoed as streamed mutations only in full-duplex mode.
#[cfg(test)]
pub(crate) const MODE_BUFFERED: i32 = 2;
pub(crate) const MODE_FULL_DUPLEX_STREAMED: i32 = 4;

/// The value of header `name` (lowercase), from `raw_value` or `value`.
pub(crate) fn header<'h>(h: &'h HttpHeaders, name: &str) -> Option<&'h [u8]> {
    let map = h.headers.as_ref()?;
    map.headers.iter().find(|v| v.key.eq_ignore_ascii_case(name)).map(|v| {
        if v.raw_value.is_empty() {
            v.value.as_bytes()
        } else {
            v.raw_value.as_slice()
        }
    })
}

/// The header as text, if it is UTF-8.
pub(crate) fn header_str<'h>(h: &'h HttpHeaders, name: &str) -> Option<&'h str> {
    header(h, name).and_then(|v| std::str::from_utf8(v).ok())
}

fn field<'m>(md: Option<&'m Metadata>, namespace: &str, key: &str) -> Option<&'m Kind> {
    md?.filter_metadata.get(namespace)?.fields.get(key)?.kind.as_ref()
}

/// The gateway's candidate subset: `Some` when the hint is present (an
/// empty list included: then nothing is eligible), `None` when any endpoint
/// may be picked. A list entry that is not a string is skipped.
pub(crate) fn subset_hint(md: Option<&Metadata>) -> Option<Vec<String>> {
    match field(md, SUBSET_NAMESPACE, SUBSET_KEY)? {
        Kind::ListValue(l) => Some(
            l.values
                .iter()
                .filter_map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Some(s.trim().to_owned()),
                    _ => None,
                })
                .collect(),
        ),
        // One endpoint given as a plain string, or a comma-separated list.
        Kind::StringValue(s) => {
            Some(s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
        }
        _ => Some(Vec::new()),
    }
}

/// The endpoint the gateway says served the response.
pub(crate) fn served_endpoint(md: Option<&Metadata>) -> Option<&str> {
    match field(md, LB_NAMESPACE, SERVED_KEY)? {
        Kind::StringValue(s) => Some(s.trim()),
        _ => None,
    }
}

fn set_header(key: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: String::new(),
            raw_value: value.to_vec(),
        }),
        ..HeaderValueOption::default()
    }
}

fn string_value(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_owned())) }
}

/// The answer to the request headers once the request is placed: the
/// endpoints in the header and in `envoy.lb` dynamic metadata (the same
/// value in both, as the protocol requires), the other header changes, and
/// a route-cache clear so the gateway routes on the new header.
pub(crate) fn routed_headers(
    endpoints: &str,
    set: &[(&str, Vec<u8>)],
    remove: &[&str],
) -> ProcessingResponse {
    let mut set_headers = vec![set_header(DESTINATION, endpoints.as_bytes())];
    set_headers.extend(set.iter().map(|(k, v)| set_header(k, v)));
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers,
            remove_headers: remove.iter().map(|s| (*s).to_owned()).collect(),
        }),
        clear_route_cache: true,
        ..CommonResponse::default()
    };
    let lb = Struct { fields: HashMap::from([(DESTINATION.to_owned(), string_value(endpoints))]) };
    let metadata = Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_owned(),
            Value { kind: Some(Kind::StructValue(lb)) },
        )]),
    };
    ProcessingResponse {
        dynamic_metadata: Some(metadata),
        response: Some(processing_response::Response::RequestHeaders(HeadersResponse {
            response: Some(common),
        })),
        ..ProcessingResponse::default()
    }
}

fn streamed(body: Vec<u8>, end_of_stream: bool) -> CommonResponse {
    CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(StreamedBodyResponse {
                body,
                end_of_stream,
                ..StreamedBodyResponse::default()
            })),
        }),
        ..CommonResponse::default()
    }
}

/// The request body re-emitted in chunks of at most [`BODY_CHUNK_BYTES`],
/// the last one marked as the end (an empty body is one empty, final
/// chunk). In full-duplex mode the gateway forwards only what the picker
/// sends back, and refuses a non-streamed body mutation.
pub(crate) fn request_body_chunks(body: &[u8]) -> Vec<ProcessingResponse> {
    let n = body.len().div_ceil(BODY_CHUNK_BYTES).max(1);
    (0..n)
        .map(|i| {
            let lo = (i * BODY_CHUNK_BYTES).min(body.len());
            let hi = ((i + 1) * BODY_CHUNK_BYTES).min(body.len());
            let r = BodyResponse { response: Some(streamed(body[lo..hi].to_vec(), i + 1 == n)) };
            ProcessingResponse {
                response: Some(processing_response::Response::RequestBody(r)),
                ..ProcessingResponse::default()
            }
        })
        .collect()
}

/// A response body chunk passed on unchanged: echoed in full-duplex mode,
/// an empty answer (keep the chunk) in the other modes.
pub(crate) fn response_body(body: Vec<u8>, end_of_stream: bool, mode: i32) -> ProcessingResponse {
    let common =
        if mode == MODE_FULL_DUPLEX_STREAMED { Some(streamed(body, end_of_stream)) } else { None };
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse {
            response: common,
        })),
        ..ProcessingResponse::default()
    }
}

/// The response headers, with header changes (none: passed on as they are).
pub(crate) fn response_headers(set: &[(&str, Vec<u8>)]) -> ProcessingResponse {
    let response = (!set.is_empty()).then(|| CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: set.iter().map(|(k, v)| set_header(k, v)).collect(),
            remove_headers: Vec::new(),
        }),
        ..CommonResponse::default()
    });
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(HeadersResponse {
            response,
        })),
        ..ProcessingResponse::default()
    }
}

/// Trailers passed on unchanged.
pub(crate) fn trailers(request: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    let response = if request {
        processing_response::Response::RequestTrailers(t)
    } else {
        processing_response::Response::ResponseTrailers(t)
    };
    ProcessingResponse { response: Some(response), ..ProcessingResponse::default() }
}

/// Headers as a plain map, for the test client.
#[cfg(test)]
pub(crate) fn headers_of(
    pairs: &[(&str, &str)],
) -> envoy_types::pb::envoy::config::core::v3::HeaderMap {
    envoy_types::pb::envoy::config::core::v3::HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn metadata(namespace: &str, key: &str, kind: Kind) -> Metadata {
        let inner =
            Struct { fields: HashMap::from([(key.to_owned(), Value { kind: Some(kind) })]) };
        Metadata {
            filter_metadata: HashMap::from([(namespace.to_owned(), inner)]),
            ..Metadata::default()
        }
    }

    #[test]
    fn subset_hint_reads_lists_strings_and_absence() {
        let list = ListValue {
            values: vec![
                string_value("10.0.0.1:8000"),
                Value { kind: None },
                string_value(" 10.0.0.2:8000 "),
            ],
        };
        let md = metadata(SUBSET_NAMESPACE, SUBSET_KEY, Kind::ListValue(list));
        assert_eq!(subset_hint(Some(&md)).unwrap(), ["10.0.0.1:8000", "10.0.0.2:8000"]);
        let md = metadata(SUBSET_NAMESPACE, SUBSET_KEY, Kind::StringValue("a:1, b:2".into()));
        assert_eq!(subset_hint(Some(&md)).unwrap(), ["a:1", "b:2"]);
        let empty = metadata(SUBSET_NAMESPACE, SUBSET_KEY, Kind::ListValue(ListValue::default()));
        assert_eq!(subset_hint(Some(&empty)), Some(vec![]));
        let other = metadata(LB_NAMESPACE, SUBSET_KEY, Kind::StringValue("a:1".into()));
        assert_eq!(subset_hint(Some(&other)), None);
        assert_eq!(subset_hint(None), None);
    }

    #[test]
    fn served_endpoint_is_read_under_envoy_lb() {
        let md = metadata(LB_NAMESPACE, SERVED_KEY, Kind::StringValue("10.0.0.3:8000".into()));
        assert_eq!(served_endpoint(Some(&md)), Some("10.0.0.3:8000"));
        let md = metadata(LB_NAMESPACE, SERVED_KEY, Kind::NumberValue(1.0));
        assert_eq!(served_endpoint(Some(&md)), None);
    }

    #[test]
    fn body_chunks_cover_the_body_in_order_and_end_once() {
        for len in [
            0,
            1,
            BODY_CHUNK_BYTES - 1,
            BODY_CHUNK_BYTES,
            BODY_CHUNK_BYTES + 1,
            5 * BODY_CHUNK_BYTES + 7,
        ] {
            let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let chunks = request_body_chunks(&body);
            let mut joined = Vec::new();
            for (i, c) in chunks.iter().enumerate() {
                let Some(processing_response::Response::RequestBody(b)) = &c.response else {
                    panic!("not a body response")
                };
                let m = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
                let Some(body_mutation::Mutation::StreamedResponse(s)) = &m.mutation else {
                    panic!("not streamed")
                };
                assert!(s.body.len() <= BODY_CHUNK_BYTES);
                assert_eq!(s.end_of_stream, i + 1 == chunks.len(), "len {len} chunk {i}");
                joined.extend_from_slice(&s.body);
            }
            assert_eq!(joined, body, "len {len}");
        }
    }

    #[test]
    fn routed_headers_carry_the_same_endpoints_in_header_and_metadata() {
        let r = routed_headers(
            "10.0.0.1:8000,10.0.0.2:8000",
            &[("content-length", b"12".to_vec())],
            &["authorization"],
        );
        let Some(processing_response::Response::RequestHeaders(h)) = &r.response else { panic!() };
        let common = h.response.as_ref().unwrap();
        assert!(common.clear_route_cache);
        let m = common.header_mutation.as_ref().unwrap();
        let dest =
            m.set_headers.iter().find(|o| o.header.as_ref().unwrap().key == DESTINATION).unwrap();
        assert_eq!(dest.header.as_ref().unwrap().raw_value, b"10.0.0.1:8000,10.0.0.2:8000");
        assert_eq!(m.remove_headers, ["authorization"]);
        let md = r.dynamic_metadata.as_ref().unwrap();
        let Some(Kind::StructValue(lb)) = &md.fields[LB_NAMESPACE].kind else { panic!() };
        assert_eq!(
            lb.fields[DESTINATION].kind,
            Some(Kind::StringValue("10.0.0.1:8000,10.0.0.2:8000".into()))
        );
    }

    #[test]
    fn header_reads_raw_or_plain_values_case_insensitively() {
        let mut map = headers_of(&[(":path", "/v1/chat/completions")]);
        map.headers.push(HeaderValue {
            key: "Content-Type".into(),
            value: "text/event-stream".into(),
            raw_value: vec![],
        });
        let h = HttpHeaders { headers: Some(map), ..HttpHeaders::default() };
        assert_eq!(header_str(&h, ":path"), Some("/v1/chat/completions"));
        assert_eq!(header_str(&h, "content-type"), Some("text/event-stream"));
        assert_eq!(header(&h, "x-missing"), None);
    }
}
