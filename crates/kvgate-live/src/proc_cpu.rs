//! CPU time of a process, from `/proc`: what the live driver charges to the
//! ingress and what the benches report (one reader for both).

use std::path::Path;

/// Seconds in one `schedstat` file (its first field, nanoseconds on the
/// CPU); 0 when it cannot be read.
pub fn schedstat_seconds(path: &Path) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
        .unwrap_or(0.0)
        / 1e9
}

/// CPU seconds of every thread of `pid` (0 when it is gone). Exact while the
/// threads wait: a running thread's figure lags by up to a scheduler tick.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    tasks.flatten().map(|t| schedstat_seconds(&t.path().join("schedstat"))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_spent_cpu_and_a_missing_one_none() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        if Path::new("/proc/self/task").exists() {
            assert!(cpu_seconds(std::process::id()) > 0.0);
        }
        assert_eq!(cpu_seconds(u32::MAX), 0.0);
        assert_eq!(schedstat_seconds(Path::new("/nonexistent/schedstat")), 0.0);
    }
}
