//! `reeve --help` lists the commands in groups, client commands apart from
//! operations: clap lists subcommands in one flat block, so the block is
//! written here from the commands' own about lines.

use clap::Command;

/// Each group's heading and its commands, in the order shown. A command
/// missing here, or named twice, fails `every_command_is_in_one_group`.
const GROUPS: &[(&str, &[&str])] = &[
    ("Space (client of any deployment)", &["space", "login", "logout", "catalog"]),
    ("Upload (client)", &["upload"]),
    ("Task (client)", &["task", "receipt"]),
    (
        "Operations (run Reeve: its catalog, database, queue and bucket)",
        &["config", "migrate", "serve", "work", "relay", "sweep", "tasks", "payments", "storage"],
    ),
];

/// `command` with its help's command list split into [`GROUPS`].
pub fn grouped(command: Command) -> Command {
    let width = GROUPS.iter().flat_map(|(_, names)| names.iter()).map(|n| n.len()).max().unwrap_or(0);
    let mut list = String::new();
    for (heading, names) in GROUPS {
        list.push_str(&format!("{heading}:\n"));
        for name in *names {
            let about =
                command.find_subcommand(name).and_then(|c| c.get_about()).map(|a| a.to_string()).unwrap_or_default();
            list.push_str(&format!("  {name:width$}  {about}\n"));
        }
        list.push('\n');
    }
    list.push_str("See `reeve help <command>` or `reeve <command> --help` for a command's own flags.\n\n");
    let template = format!(
        "{{before-help}}{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{list}Options:\n{{options}}{{after-help}}"
    );
    command.help_template(template)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_command_is_in_one_group() {
        let command = crate::Cli::command();
        let mut listed: Vec<&str> = GROUPS.iter().flat_map(|(_, names)| names.iter().copied()).collect();
        let mut real: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
        listed.sort_unstable();
        real.sort_unstable();
        assert_eq!(listed, real, "GROUPS must name every command of `reeve` exactly once");
    }

    #[test]
    fn the_help_shows_each_group_with_its_commands_abouts() {
        let help = grouped(crate::Cli::command()).render_help().to_string();
        for heading in ["Space (client", "Upload (client)", "Task (client)", "Operations ("] {
            assert!(help.contains(heading), "{heading} missing from:\n{help}");
        }
        assert!(help.contains("Run the worker: long-poll the SQS queue"), "{help}");
        // Groups follow one another in GROUPS order, each command under its own.
        let at = |s: &str| help.find(s).unwrap_or_else(|| panic!("{s} missing from:\n{help}"));
        assert!(at("Space (client") < at("  login") && at("  login") < at("Upload (client)"));
        assert!(at("Operations (") < at("  serve"));
        assert!(help.contains("--help"), "{help}");
    }
}
