//! Engine SSE streams: the parser never panics, stays within its buffer
//! bound, and yields the same events however the bytes are chunked.
#![no_main]

use kvgate_openai::SseParser;
use libfuzzer_sys::fuzz_target;

const MAX_EVENT: usize = 4096;

fn parse(chunks: &[&[u8]]) -> (Vec<kvgate_openai::SseItem>, usize) {
    let mut p = SseParser::new(MAX_EVENT);
    let (mut out, mut errors) = (Vec::new(), 0);
    for c in chunks {
        if p.feed(c, &mut out).is_err() {
            errors += 1;
        }
        assert!(p.buffered_len() <= MAX_EVENT + 8, "buffer {} past its bound", p.buffered_len());
    }
    let _ = p.finish();
    (out, errors)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let whole = parse(&[rest]);
    // The same bytes in chunks of 1..=16 bytes (sizes from the first byte).
    let step = usize::from(split % 16) + 1;
    let pieces: Vec<&[u8]> = rest.chunks(step).collect();
    let chunked = parse(&pieces);
    assert_eq!(whole.0, chunked.0);
});
