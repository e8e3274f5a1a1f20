//! The binary's exit codes: one enum, the same table as docs/reference/cli.md's "Errors and
//! exit codes" (a test below reads that table and holds the two together).

/// How `roster` exits. Command-line errors found by the argument parser exit
/// [`Exit::Usage`] too (clap's own code for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It did what was asked.
    Success = 0,
    /// Nothing was found, or the agent could not do it (or the agent could not start).
    Failed = 1,
    /// The command line or the input is wrong; nothing was sent.
    Usage = 2,
    /// The agent cannot be reached, or refused our credentials.
    Unreachable = 3,
}

impl Exit {
    /// Every exit code, in order.
    pub const ALL: [Exit; 4] = [Exit::Success, Exit::Failed, Exit::Usage, Exit::Unreachable];

    /// The process's exit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// What the code means, as the reference's table says it.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Failed => "not found, or failed",
            Exit::Usage => "usage or bad input",
            Exit::Unreachable => "cannot reach or authenticate to the agent",
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of cli.md's exit-code table: (code, meaning).
    fn documented() -> Vec<(u8, String)> {
        let doc = include_str!("../../docs/reference/cli.md");
        let table = doc
            .split("| code | meaning | examples |")
            .nth(1)
            .expect("cli.md has the exit-code table (| code | meaning | examples |)");
        table
            .lines()
            .skip(2) // the rest of the header line, and the |---| line
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let code = cells[1].parse().expect("a code is a number");
                (code, cells[2].to_string())
            })
            .collect()
    }

    #[test]
    fn the_exit_code_table_of_the_reference_is_the_enum() {
        let from_enum: Vec<(u8, String)> = Exit::ALL
            .iter()
            .map(|e| (e.code(), e.meaning().to_string()))
            .collect();
        assert_eq!(documented(), from_enum);
    }
}
