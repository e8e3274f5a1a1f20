//! The `roster` command.
//!
//! For now it reports its version; `roster agent` and the query commands (`ls`, `get`,
//! `watch`, `members`, ...) arrive with the agent.

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        None | Some("--version") | Some("-V") | Some("version") => {
            println!("roster {}", env!("CARGO_PKG_VERSION"));
        }
        Some("--help") | Some("-h") | Some("help") => {
            println!(
                "roster {}: a replicated service registry",
                env!("CARGO_PKG_VERSION")
            );
            println!("usage: roster --version");
            println!("The agent and the query commands are not built yet; see README.md.");
        }
        Some(other) => {
            eprintln!("roster: unknown command {other:?}; run `roster --help` for the commands");
            std::process::exit(2);
        }
    }
}
