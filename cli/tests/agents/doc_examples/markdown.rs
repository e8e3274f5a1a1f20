//! A Markdown file as the steps of its examples: each ```console block's `$ command` lines
//! with the output shown under them, and the `<!-- doc-test: ... -->` directives that say how
//! to run a block that a plain shell cannot (a second terminal, a kill, a file to write).

/// One command of a console block and the output the doc shows for it.
#[derive(Debug, Clone)]
pub struct Example {
    /// The line of the `$` in the file, 1-based.
    pub line: usize,
    /// The command, continuation lines (ending in `\`) included.
    pub command: String,
    /// The output shown under it, up to the next `$` or the end of the block.
    pub expected: String,
}

/// What the runner does for one block or directive, in file order.
#[derive(Debug, Clone)]
pub enum Step {
    /// Run each command in the flow's shell and compare its output.
    Run(Vec<Example>),
    /// As `Run`, again and again for a while until the output matches (`eventually`).
    Eventually(Vec<Example>),
    /// Start the block's one command as a process of its own named `name` (another
    /// terminal), and compare its first lines of stdout (`background NAME`).
    Background { name: String, example: Example },
    /// The next lines the process `name` prints are the block's (`output NAME`).
    Output {
        name: String,
        line: usize,
        expected: String,
    },
    /// Write the block to the file `path` in the flow's directory (`file PATH`).
    File { path: String, content: String },
    /// SIGINT, as Ctrl-C in its terminal, then wait for the process to exit (`interrupt NAME`).
    Interrupt { name: String, line: usize },
    /// SIGKILL it, as `kill -9` does (`kill NAME`).
    Kill { name: String, line: usize },
    /// Wait for the process to exit by itself (`exits NAME`).
    Exits { name: String, line: usize },
}

/// The directives that take the next fenced block.
const BLOCK_DIRECTIVES: [&str; 5] = ["skip", "eventually", "background", "output", "file"];
/// The directives that stand alone.
const STANDALONE_DIRECTIVES: [&str; 3] = ["interrupt", "kill", "exits"];

/// The steps of `markdown`; `file` names it in errors.
///
/// # Panics
///
/// On a directive it does not know, one without its argument, or a directive that takes a
/// block with no block after it: the message names the file and line.
pub fn steps(file: &str, markdown: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut pending: Option<(usize, String, String)> = None;
    let mut lines = markdown.lines().enumerate().map(|(i, l)| (i + 1, l));
    while let Some((n, line)) = lines.next() {
        if let Some((word, arg)) = directive(line) {
            if STANDALONE_DIRECTIVES.contains(&word) {
                steps.push(standalone(file, n, word, arg));
            } else if BLOCK_DIRECTIVES.contains(&word) {
                pending = Some((n, word.to_string(), arg.to_string()));
            } else {
                panic!("{file}:{n}: unknown doc-test directive {word:?}; the runner knows {BLOCK_DIRECTIVES:?} and {STANDALONE_DIRECTIVES:?}");
            }
            continue;
        }
        let Some(lang) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<(usize, &str)> = lines
            .by_ref()
            .take_while(|(_, l)| !l.starts_with("```"))
            .collect();
        let directive = pending.take();
        if let Some(step) = block_step(file, lang.trim(), &body, directive) {
            steps.push(step);
        }
    }
    if let Some((n, word, _)) = pending {
        panic!("{file}:{n}: doc-test directive {word:?} with no code block after it");
    }
    steps
}

/// `<!-- doc-test: WORD ARG -->` as (WORD, ARG).
fn directive(line: &str) -> Option<(&str, &str)> {
    let inner = line
        .trim()
        .strip_prefix("<!-- doc-test:")?
        .strip_suffix("-->")?
        .trim();
    Some(inner.split_once(' ').map_or((inner, ""), |(w, a)| (w, a.trim())))
}

fn standalone(file: &str, line: usize, word: &str, name: &str) -> Step {
    assert!(
        !name.is_empty(),
        "{file}:{line}: `doc-test: {word}` needs the name of a process"
    );
    let name = name.to_string();
    match word {
        "interrupt" => Step::Interrupt { name, line },
        "kill" => Step::Kill { name, line },
        _ => Step::Exits { name, line },
    }
}

/// The step of one fenced block, given the directive before it.
fn block_step(
    file: &str,
    lang: &str,
    body: &[(usize, &str)],
    directive: Option<(usize, String, String)>,
) -> Option<Step> {
    let Some((n, word, arg)) = directive else {
        return (lang == "console").then(|| Step::Run(examples(file, body)));
    };
    let needs_arg = |what: &str| {
        assert!(!arg.is_empty(), "{file}:{n}: `doc-test: {word}` needs {what}");
        arg.clone()
    };
    match word.as_str() {
        "skip" => {
            needs_arg("a reason");
            None
        }
        "eventually" => Some(Step::Eventually(examples(file, body))),
        "background" => {
            let name = needs_arg("the name of the process");
            let mut ex = examples(file, body);
            assert!(
                ex.len() == 1,
                "{file}:{n}: a background block has one `$` command, not {}",
                ex.len()
            );
            Some(Step::Background {
                name,
                example: ex.remove(0),
            })
        }
        "output" => Some(Step::Output {
            name: needs_arg("the name of the process"),
            line: body.first().map_or(n, |(l, _)| *l),
            expected: joined(body.iter().map(|(_, l)| *l)),
        }),
        _ => Some(Step::File {
            path: needs_arg("a path"),
            content: joined(body.iter().map(|(_, l)| *l)),
        }),
    }
}

/// The `$` commands of a console block and the output under each.
fn examples(file: &str, body: &[(usize, &str)]) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut continued = false;
    for (n, line) in body {
        if continued {
            let ex = out.last_mut().expect("a continued command");
            ex.command.push('\n');
            ex.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            out.push(Example {
                line: *n,
                command: cmd.to_string(),
                expected: String::new(),
            });
            continued = cmd.ends_with('\\');
        } else {
            let ex = out
                .last_mut()
                .unwrap_or_else(|| panic!("{file}:{n}: output before any `$ command` in a console block"));
            ex.expected.push_str(line);
            ex.expected.push('\n');
        }
    }
    out
}

fn joined<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    lines.map(|l| format!("{l}\n")).collect()
}
