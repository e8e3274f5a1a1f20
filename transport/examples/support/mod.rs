//! What the transport's examples share (a directory without `main.rs`: not an example).

/// The number after `name` on the command line, or `default`.
///
/// # Panics
/// When what follows `name` is not a number (a benchmark's flag, read once at its start).
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}
