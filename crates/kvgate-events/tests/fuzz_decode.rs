//! Fuzzing the decoders with proptest: arbitrary bytes, and valid payloads
//! with random byte mutations (which reach much deeper into the decoder than
//! random bytes do). The assertions: no panic, every failure is a typed
//! error, and the fast decoder agrees with the reference decoder on every
//! input (differential fuzzing).
//!
//! CI runs a few thousand cases. For the long run recorded in
//! docs/benchmarks.md set `KVGATE_FUZZ_CASES`, e.g.
//! `KVGATE_FUZZ_CASES=1000000 cargo test --release -p kvgate-events --test fuzz_decode`.

mod strategies;

use kvgate_events::frames::{parse_pub, parse_replay};
use kvgate_events::{decode_batch, decode_batch_reference, encode_batch, Layout};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn cases() -> u32 {
    std::env::var("KVGATE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4000)
}

/// The fast decoder must give exactly the reference decoder's answer
/// (compared as `Debug` text, so that a NaN timestamp equals itself).
fn same_as_reference(bytes: &[u8]) -> Result<(), TestCaseError> {
    let fast = format!("{:?}", decode_batch(bytes));
    prop_assert_eq!(fast, format!("{:?}", decode_batch_reference(bytes)));
    Ok(())
}

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() })
}

#[test]
fn arbitrary_bytes_never_panic() {
    runner()
        .run(&proptest::collection::vec(any::<u8>(), 0..512), |bytes| {
            same_as_reference(&bytes)?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn mutated_valid_payloads_never_panic() {
    let strategy = (
        strategies::batch(),
        0usize..3,
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        any::<prop::sample::Index>(),
    );
    runner()
        .run(&strategy, |(batch, layout, edits, cut)| {
            let mut bytes = encode_batch(&batch, Layout::ALL[layout]);
            for (at, byte) in edits {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
            }
            // Also truncate sometimes.
            if !bytes.is_empty() && cut.index(4) == 0 {
                let keep = cut.index(bytes.len());
                bytes.truncate(keep);
            }
            same_as_reference(&bytes)?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn arbitrary_frames_never_panic() {
    let frames = proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 0..6);
    runner()
        .run(&frames, |frames| {
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let _ = parse_pub(&refs);
            let _ = parse_replay(&refs);
            Ok(())
        })
        .unwrap();
}
