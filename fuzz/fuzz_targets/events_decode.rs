//! KV-event payloads from the network: the decoder never panics, and its
//! fast path answers exactly as the reference decoder does.
#![no_main]

use kvgate_events::frames::{parse_pub, parse_replay};
use kvgate_events::{decode_batch, decode_batch_reference};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Debug text, so that a NaN timestamp compares equal to itself.
    let fast = format!("{:?}", decode_batch(data));
    let reference = format!("{:?}", decode_batch_reference(data));
    assert_eq!(fast, reference);
    // The same bytes as multipart frames, split at every 0xff byte.
    let frames: Vec<&[u8]> = data.split(|b| *b == 0xff).collect();
    let _ = parse_pub(&frames);
    let _ = parse_replay(&frames);
});
