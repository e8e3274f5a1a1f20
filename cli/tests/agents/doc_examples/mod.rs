//! The docs' examples, run as written against real agents: every ```console block of the
//! README, the guides and the references, its `$` commands run in one shell, their output
//! compared with the doc's (snapbox: `[..]` and `...` wildcards, redactions of ports, ids,
//! times and ages; see `redact`), and a value the doc shows twice must be one value printed
//! twice (`same`). A disagreement fails with the file and line.
//!
//! The guides are one flow, as a new user reads them: README, getting started, embedding,
//! the HTTP API, DNS; each goes on with the agents and registrations the one before left, so
//! their examples must agree with each other. The CLI reference is a flow of its own.
//!
//! A block a shell cannot run as it stands takes a directive on the line before it:
//!
//! | directive | what the runner does |
//! |---|---|
//! | `<!-- doc-test: background NAME -->` | starts the block's one command as a process of its own (another terminal), compares its first lines |
//! | `<!-- doc-test: output NAME -->` | the block is the next lines that process prints |
//! | `<!-- doc-test: eventually -->` | runs the block again until it matches (what follows a kill) |
//! | `<!-- doc-test: file PATH -->` | writes the block to `PATH` in the flow's directory |
//! | `<!-- doc-test: skip REASON -->` | does not run the block |
//! | `<!-- doc-test: interrupt NAME -->`, `kill NAME`, `exits NAME` | Ctrl-C, `kill -9`, or waits for it to exit (on a line of its own) |

mod flow;
mod markdown;
mod redact;
mod same;
mod shell;

/// The guides, in the order the README sends a new user through them.
const GUIDES: [&str; 5] = [
    "README.md",
    "docs/guide/getting-started.md",
    "docs/guide/embedding.md",
    "docs/reference/http.md",
    "docs/reference/dns.md",
];

#[test]
fn the_readme_and_the_guides_run_as_one_flow_as_written() {
    let mut flow = flow::Flow::new();
    for file in GUIDES {
        flow.file(file);
    }
    let compared = flow.finish();
    assert!(
        compared >= 50,
        "only {compared} outputs compared: are the console blocks read?"
    );
}

#[test]
fn the_cli_reference_runs_as_written() {
    let mut flow = flow::Flow::new();
    flow.file("docs/reference/cli.md");
    let compared = flow.finish();
    assert!(
        compared >= 1,
        "only {compared} outputs compared: are the console blocks read?"
    );
}

#[test]
fn a_doc_line_the_binary_does_not_print_fails_naming_its_file_and_line() {
    let doc = "text\n\n```console\n$ roster --version\nroster 0.0.0-not-this-one\n```\n";
    let steps = markdown::steps("x.md", doc);
    let mut flow = flow::Flow::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.md");
    std::fs::write(&path, doc).unwrap();
    assert_eq!(steps.len(), 1);
    flow.file(path.to_str().unwrap());
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| flow.finish()))
        .expect_err("a wrong version line fails");
    let message = failure.downcast_ref::<String>().unwrap();
    assert!(
        message.contains(&format!("{}:4: `$ roster --version`", path.display())),
        "{message}"
    );
    assert!(message.contains("0.0.0-not-this-one"), "{message}");
}

#[test]
fn a_value_the_doc_shows_twice_must_be_one_value_printed_twice() {
    let mut same = same::Same::new();
    let doc = "web-1  3b94983390832086  2026-11-30T04:01:38.511Z\n";
    same.check(
        "x.md:1",
        "web-1  aaaaaaaaaaaaaaaa  2026-12-02T10:00:00.000Z\n",
        doc,
    )
    .unwrap();
    // The same node, registered at the same time: as the doc says.
    same.check(
        "x.md:2",
        "web-1  aaaaaaaaaaaaaaaa  2026-12-02T10:00:00.000Z\n",
        doc,
    )
    .unwrap();
    // A new registered_at after a restart, where the doc shows the one before.
    let err = same
        .check(
            "x.md:3",
            "web-1  aaaaaaaaaaaaaaaa  2026-12-02T10:00:05.000Z\n",
            doc,
        )
        .unwrap_err();
    assert!(err.contains("x.md:3") && err.contains("at x.md:1"), "{err}");
    // Two values the doc tells apart may be one printed (the same millisecond).
    let other = "web-2  3b94983390832086  2026-11-30T04:01:39.000Z\n";
    same.check(
        "x.md:4",
        "web-2  aaaaaaaaaaaaaaaa  2026-12-02T10:00:00.000Z\n",
        other,
    )
    .unwrap();
}
