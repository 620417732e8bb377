//! The request-level metrics on a bare engine in virtual time: the driver's
//! bookkeeping (`Tracker`) and the exposition (`Metrics`), checked against
//! the timing model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use super::Tracker;
use crate::server::metrics::{scrape, scrape_histogram, scrape_labeled, Metrics};
use crate::{Engine, EngineConfig, StepWork};

const BLOCKS: u32 = 64;

fn config() -> EngineConfig {
    EngineConfig { num_gpu_blocks: BLOCKS, hash_seed: Some(1), ..EngineConfig::default() }
}

/// The engine, its tracker and metrics, on one virtual clock.
struct Rig {
    engine: Engine,
    tracker: Tracker,
    metrics: Metrics,
    now: Duration,
}

impl Rig {
    fn new(config: EngineConfig) -> Rig {
        let metrics = Metrics::new(config.max_model_len());
        Rig {
            engine: Engine::new(config).unwrap(),
            tracker: Tracker::default(),
            metrics,
            now: Duration::ZERO,
        }
    }

    fn add(&mut self, id: u64, prompt: Vec<u32>, max_tokens: u32) {
        let len = prompt.len();
        self.engine.add_request(id, prompt, max_tokens, 0, true, self.now).unwrap();
        self.tracker.add(id, len, self.now);
    }

    /// Steps until idle, as the driver does; returns each step's duration.
    fn run(&mut self) -> Vec<Duration> {
        let mut durations = Vec::new();
        while self.engine.has_work() {
            let out = self.engine.step(self.now);
            self.metrics.record(&self.tracker.step(self.now, &out));
            self.now += out.duration;
            durations.push(out.duration);
        }
        durations
    }

    fn text(&self) -> String {
        self.metrics.render("m", self.engine.config(), 0)
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[track_caller]
fn hist(text: &str, name: &str) -> (f64, f64) {
    let h = scrape_histogram(text, name).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
    (h.sum, h.count)
}

fn prompt(len: u32) -> Vec<u32> {
    (1..=len).collect()
}

/// The step time of a prefill of `tokens` new tokens with `blocks` GPU
/// blocks in use and nothing decoding.
fn prefill_step(config: &EngineConfig, tokens: u64, blocks: u32) -> f64 {
    let used = f64::from(blocks) / f64::from(config.num_gpu_blocks);
    let work = StepWork { prefill_tokens: tokens, kv_fraction: used, ..StepWork::default() };
    config.timing.step_duration(&work).as_secs_f64()
}

#[test]
fn single_request_phases_match_the_timing_model() {
    let mut rig = Rig::new(config());
    rig.add(1, prompt(100), 4);
    let steps = rig.run();
    assert_eq!(steps.len(), 4, "one prefill step, three decode steps");
    let text = rig.text();
    let total = rig.now.as_secs_f64();
    // 100 tokens: 7 blocks of 16.
    let prefill = prefill_step(rig.engine.config(), 100, 7);
    assert!(close(steps[0].as_secs_f64(), prefill));

    let (sum, count) = hist(&text, "vllm:request_prefill_time_seconds");
    assert_eq!(count, 1.0);
    assert!(close(sum, prefill), "prefill {sum} vs the step's {prefill}");
    assert_eq!(hist(&text, "vllm:request_queue_time_seconds"), (0.0, 1.0));
    let (ttft, _) = hist(&text, "vllm:time_to_first_token_seconds");
    assert!(close(ttft, prefill));
    let (e2e, _) = hist(&text, "vllm:e2e_request_latency_seconds");
    assert!(close(e2e, total));
    let (inference, _) = hist(&text, "vllm:request_inference_time_seconds");
    assert!(close(inference, total));
    let (decode, _) = hist(&text, "vllm:request_decode_time_seconds");
    assert!(close(decode, total - prefill));
    let (tpot, count) = hist(&text, "vllm:request_time_per_output_token_seconds");
    assert_eq!(count, 1.0);
    assert!(close(tpot, decode / 3.0));
    let (itl, count) = hist(&text, "vllm:inter_token_latency_seconds");
    assert_eq!(count, 3.0);
    assert!(close(itl, decode));

    assert_eq!(hist(&text, "vllm:request_prefill_kv_computed_tokens"), (100.0, 1.0));
    assert_eq!(hist(&text, "vllm:request_prompt_tokens"), (100.0, 1.0));
    assert_eq!(hist(&text, "vllm:request_generation_tokens"), (4.0, 1.0));
    assert_eq!(hist(&text, "vllm:request_num_preemptions"), (0.0, 1.0));
    // Four steps with output: 100 computed prompt tokens + 4 generated.
    assert_eq!(hist(&text, "vllm:iteration_tokens_total"), (104.0, 4.0));
    assert_eq!(scrape(&text, "vllm:prompt_tokens_total"), Some(100.0));
    assert_eq!(scrape(&text, "vllm:prompt_tokens_cached_total"), Some(0.0));
    let success = |reason: &str| {
        scrape_labeled(
            &text,
            "vllm:request_success_total",
            &format!("finished_reason=\"{reason}\""),
        )
    };
    assert_eq!(success("length"), Some(1.0));
    assert_eq!(success("stop"), Some(0.0));
    assert_eq!(success("abort"), Some(0.0));
}

#[test]
fn a_cached_prefix_is_not_computed_again() {
    let mut rig = Rig::new(config());
    rig.add(1, prompt(100), 2);
    rig.run();
    let before = scrape_histogram(&rig.text(), "vllm:request_prefill_time_seconds").unwrap();
    // The same prompt again: 6 full blocks hit (96 tokens; the last token is
    // always computed), 4 tokens computed in 7 blocks.
    rig.add(2, prompt(100), 2);
    let steps = rig.run();
    let text = rig.text();
    let prefill = prefill_step(rig.engine.config(), 4, 7);
    assert!(close(steps[0].as_secs_f64(), prefill));
    let (sum, count) = hist(&text, "vllm:request_prefill_time_seconds");
    assert_eq!(count, 2.0);
    assert!(close(sum - before.sum, prefill), "prefill {} vs {prefill}", sum - before.sum);
    assert_eq!(hist(&text, "vllm:request_prefill_kv_computed_tokens"), (104.0, 2.0));
    assert_eq!(scrape(&text, "vllm:prompt_tokens_total"), Some(200.0));
    assert_eq!(scrape(&text, "vllm:prompt_tokens_cached_total"), Some(96.0));
    let source = |s: &str| {
        scrape_labeled(&text, "vllm:prompt_tokens_by_source_total", &format!("source=\"{s}\""))
    };
    assert_eq!(source("local_compute"), Some(104.0));
    assert_eq!(source("local_cache_hit"), Some(96.0));
    assert_eq!(source("external_kv_transfer"), Some(0.0));
    // The iteration histogram counts computed prompt tokens, not cached ones.
    assert_eq!(hist(&text, "vllm:iteration_tokens_total"), (100.0 + 4.0 + 4.0, 4.0));
}

#[test]
fn a_queued_request_waits_for_the_running_one() {
    let mut rig = Rig::new(EngineConfig { max_num_seqs: 1, ..config() });
    rig.add(1, prompt(40), 3);
    rig.add(2, (500..540).collect(), 3);
    rig.run();
    let text = rig.text();
    let (queue, count) = hist(&text, "vllm:request_queue_time_seconds");
    assert_eq!(count, 2.0);
    // Request 2 is first scheduled in the step after request 1's last.
    let (e2e, _) = hist(&text, "vllm:e2e_request_latency_seconds");
    let (inference, _) = hist(&text, "vllm:request_inference_time_seconds");
    assert!(close(e2e, queue + inference));
    let first_e2e = e2e - rig.now.as_secs_f64();
    assert!(close(queue, first_e2e), "queue {queue} vs request 1's e2e {first_e2e}");
}

#[test]
fn an_aborted_request_is_not_observed() {
    let mut rig = Rig::new(config());
    rig.add(1, prompt(40), 8);
    let out = rig.engine.step(rig.now);
    rig.metrics.record(&rig.tracker.step(rig.now, &out));
    rig.engine.abort(1);
    rig.tracker.abort(1);
    let text = rig.text();
    assert_eq!(hist(&text, "vllm:e2e_request_latency_seconds"), (0.0, 0.0));
    assert_eq!(hist(&text, "vllm:time_to_first_token_seconds").1, 1.0);
    assert_eq!(scrape(&text, "vllm:prompt_tokens_total"), Some(40.0));
}

#[test]
fn a_sped_up_engine_reports_wall_seconds() {
    // The same request on the same model clock, tracked as a 4× engine: every
    // phase is reported 4× shorter, as a faster engine would measure it.
    let run = |speedup: f64| {
        let mut engine = Engine::new(config()).unwrap();
        let mut tracker = Tracker::with_speedup(speedup);
        engine.add_request(1, prompt(100), 3, 3, true, Duration::ZERO).unwrap();
        tracker.add(1, 100, Duration::ZERO);
        let mut now = Duration::ZERO;
        let mut finished = Vec::new();
        while engine.has_work() {
            let out = engine.step(now);
            finished.extend(tracker.step(now, &out).finished);
            now += out.duration;
        }
        finished.pop().unwrap()
    };
    let (model, wall) = (run(1.0), run(4.0));
    assert!(model.prefill > 0.0 && model.decode > 0.0);
    assert!(close(wall.prefill * 4.0, model.prefill) && close(wall.e2e * 4.0, model.e2e));
    assert_eq!(wall.prefill_kv_computed_tokens, 100);
    // Nonsense speedups count as 1.
    assert!(close(Tracker::with_speedup(0.0).speedup, 1.0));
}
