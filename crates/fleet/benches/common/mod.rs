//! What the fleet benches share: their one option and their runtime.

/// `--samples N` (default `full`) or `--quick` (`quick`); `Err` holds the usage error.
pub fn samples(bench: &str, full: usize, quick: usize) -> Result<usize, String> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut samples = full;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => samples = quick,
            "--samples" => match it.next().and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => samples = n,
                _ => return Err("--samples: give a positive number".into()),
            },
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: {bench} [--samples N] [--quick]"
                ));
            }
        }
    }
    Ok(samples)
}

/// The runtime every bench runs in: two workers, as the machines they are measured on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
