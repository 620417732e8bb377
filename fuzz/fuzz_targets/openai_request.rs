//! Client request bodies: parsing never panics; what parses re-serialises
//! into a body that parses to the same request; token ids appended to the
//! client's bytes come back out of the result.
#![no_main]

use kvgate_openai::{ChatCompletionRequest, CompletionRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = ChatCompletionRequest::from_slice(data) {
        let _ = req.validate();
        let again = ChatCompletionRequest::from_slice(&req.to_vec().expect("serialises"))
            .expect("re-parses");
        assert_eq!(again, req);
        if !req.has_non_text_content() {
            let body = req.body_with_prompt_token_ids(data, &[7, 0, 4_000_000_000]).expect("builds");
            let with = ChatCompletionRequest::from_slice(&body).expect("appended body parses");
            assert_eq!(with.prompt_token_ids(), Some(vec![7, 0, 4_000_000_000]));
        }
    }
    if let Ok(req) = CompletionRequest::from_slice(data) {
        let again = CompletionRequest::from_slice(&req.to_vec().expect("serialises"))
            .expect("re-parses");
        assert_eq!(again, req);
    }
});
