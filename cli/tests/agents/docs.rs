//! docs/reference/cli.md against the binary: the commands it lists. (Its examples, the
//! agent's first lines and `roster status` among them, run in `doc_examples`.)

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
