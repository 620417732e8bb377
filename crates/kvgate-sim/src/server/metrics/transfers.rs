//! The NIXL connector's transfer series, as vLLM 0.33 exports them on the
//! side that pulls the KV (`distributed/kv_transfer/kv_connector/v1/nixl/
//! stats.py`): each transfer's duration and its bytes. A decode hop's
//! receipt is one transfer. kvgate calibrates a disaggregated pool's link
//! from them.

use super::histogram::Histogram;

/// `vllm:nixl_xfer_time_seconds`' buckets (vLLM drops the first, 1 ms, of
/// the list it shares with the post time).
const XFER_TIME_BUCKETS: [f64; 12] =
    [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0];

/// `vllm:nixl_bytes_transferred`' buckets: 2 KiB to 8 GiB, ×4.
fn bytes_buckets() -> Vec<f64> {
    (1..25).step_by(2).map(|i| 2f64.powi(10 + i)).collect()
}

#[derive(Debug)]
pub(super) struct Transfers {
    time: Histogram,
    bytes: Histogram,
}

impl Transfers {
    pub(super) fn new() -> Transfers {
        Transfers {
            time: Histogram::new(
                "vllm:nixl_xfer_time_seconds",
                "Histogram of transfer duration for NIXL KV Cache transfers.",
                &XFER_TIME_BUCKETS,
            ),
            bytes: Histogram::new(
                "vllm:nixl_bytes_transferred",
                "Histogram of bytes transferred per NIXL KV Cache transfers.",
                &bytes_buckets(),
            ),
        }
    }

    pub(super) fn observe(&mut self, seconds: f64, bytes: f64) {
        self.time.observe(seconds);
        self.bytes.observe(bytes);
    }

    pub(super) fn render(&self, out: &mut String, labels: &str) {
        self.time.render(out, labels);
        self.bytes.render(out, labels);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_buckets_run_from_2_kib_to_8_gib() {
        let b = super::bytes_buckets();
        assert_eq!((b.len(), b[0], b[11]), (12, 2048.0, 8.0 * 1024.0 * 1024.0 * 1024.0));
    }
}
