//! `completion`: a shell completion script for this command line, from clap's definition.

use std::ffi::OsStr;
use std::path::Path;

use clap::Args;
use clap_complete::Shell;

#[derive(Args)]
pub(super) struct CompletionArgs {
    /// The shell: bash, zsh, fish, powershell or elvish.
    pub shell: Shell,
}

/// The completion script of `cmd` for `shell`, completing the program by its file name
/// (`agentbox`, or `kubectl-agentbox` when installed as the kubectl plugin).
pub(super) fn script(cmd: clap::Command, shell: Shell, argv0: Option<&OsStr>) -> Vec<u8> {
    // The shell completes what the user types first: the executable's name, never a path
    // and never kubectl's two-word form.
    let bin = argv0
        .and_then(|a| Path::new(a).file_name())
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "agentbox".into());
    let mut cmd = cmd.bin_name(&bin);
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, bin, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn every_shell_gets_a_script_naming_every_subcommand() {
        let subcommands: Vec<String> = super::super::command(None)
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        assert!(subcommands.len() >= 9, "{subcommands:?}");
        for shell in Shell::value_variants() {
            let s = script(
                super::super::command(None),
                *shell,
                Some(OsStr::new("agentbox")),
            );
            let s = String::from_utf8(s).unwrap();
            // Whole words: `cp` must be there as a word, not inside another one.
            let words: std::collections::HashSet<&str> = s
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .collect();
            assert!(words.contains("agentbox"), "{shell}: names the program");
            for sub in &subcommands {
                assert!(words.contains(sub.as_str()), "{shell}: no {sub}");
            }
        }
    }

    #[test]
    fn the_script_completes_the_executable_name() {
        let s = script(
            super::super::command(Some(OsStr::new("/usr/bin/kubectl-agentbox"))),
            Shell::Bash,
            Some(OsStr::new("/usr/bin/kubectl-agentbox")),
        );
        let s = String::from_utf8(s).unwrap();
        assert!(
            s.lines()
                .any(|l| l.trim_start().starts_with("complete -F")
                    && l.ends_with(" kubectl-agentbox")),
            "{s}"
        );
        assert!(!s.contains("/usr/bin"), "no path in the script");
    }
}
