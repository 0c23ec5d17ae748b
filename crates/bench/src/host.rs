//! Facts about the machine a benchmark runs on, printed with its results.

/// `/proc/loadavg`'s first three fields.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The CPU's model name from `/proc/cpuinfo`.
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// CPUs this process may run on.
pub(crate) fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
