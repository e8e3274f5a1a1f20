//! docs/reference/cli.md against the binary: the commands it lists, the lines an agent
//! prints at its start, and the labels of `roster status`.

use super::*;

fn reference() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/cli.md")).unwrap()
}

/// The fenced block that follows the first line of the reference holding `after`.
fn block_after(doc: &str, after: &str) -> Vec<String> {
    let rest = &doc[doc.find(after).unwrap_or_else(|| panic!("{after:?} in cli.md"))..];
    rest.lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_reference_lists_every_command_of_the_binary() {
    let help = text(&roster(&["--help"]).stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() > 10, "{help}");
    let doc = reference();
    let synopsis = block_after(&doc, "# CLI reference");
    for c in commands {
        assert!(
            synopsis.iter().any(|l| l.split_whitespace().nth(1) == Some(c)),
            "`roster {c}` is not in the synopsis of cli.md"
        );
        assert!(
            doc.contains(&format!("| [`{c}`](#")),
            "`{c}` is not in the command table of cli.md"
        );
        assert!(
            doc.contains(&format!("roster {c}")),
            "no section for `roster {c}` in cli.md"
        );
    }
}

#[test]
fn an_agent_prints_at_its_start_the_lines_the_reference_shows() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &["--http-listen", "127.0.0.1:0"]);
    let mut printed = vec![format!("listening on {}", a.url)];
    while let Ok(l) = a.stdout.recv_timeout(Duration::from_secs(5)) {
        let last = l.starts_with("joining");
        printed.push(l);
        if last {
            break;
        }
    }
    let shown = block_after(&reference(), "Once started, the agent prints");
    // The first line is read by Agent::start; the others, by their first two words.
    let words = |l: &str| l.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    let shown: Vec<String> = shown.iter().skip(1).map(|l| words(l)).collect();
    let printed: Vec<String> = printed.iter().map(|l| words(l)).collect();
    assert_eq!(shown, printed);
}

#[test]
fn roster_status_prints_the_labels_the_reference_shows() {
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&root.path().join("a"), "a", &[]);
    let out = a.roster(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let label = |l: &str| l.split_once(':').map(|(k, _)| k.to_string());
    let printed: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(label)
        .collect();
    let doc = reference();
    let example = &doc[doc.find("$ roster status\n").unwrap()..];
    let shown: Vec<String> = example
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.starts_with(' '))
        .filter_map(label)
        .collect();
    assert_eq!(shown, printed);
    let launches = text(&out.stdout);
    let line = launches.lines().find(|l| l.starts_with("launches:")).unwrap();
    assert!(line.ends_with("within the crash-guard window"), "{line}");
}
