//! `docs/options.md`, rendered from `nightshift::cli::Cli`: one section per subcommand, one table
//! row per visible option (flag, environment variable, default, first line of its help).

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command, CommandFactory};
use nightshift::cli::Cli;

use crate::repo_root;

/// Set to `1` to rewrite `docs/options.md` from the code instead of comparing it.
const BLESS_ENV: &str = "NIGHTSHIFT_BLESS";

/// Where the rendering lives, relative to the repository root.
const OPTIONS_PAGE: &str = "docs/options.md";

/// Compares `docs/options.md` with the rendering of the command line, or rewrites it when
/// `NIGHTSHIFT_BLESS=1`.
pub fn check_or_bless() {
    let rendered = render();
    let path = repo_root().join(OPTIONS_PAGE);
    if std::env::var(BLESS_ENV).is_ok_and(|v| v == "1") {
        std::fs::write(&path, &rendered)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let line = first_different_line(&on_disk, &rendered);
        let at = |text: &str| {
            text.lines()
                .nth(line - 1)
                .map_or("(end of file)".to_string(), |l| format!("{l:?}"))
        };
        panic!(
            "{OPTIONS_PAGE} is out of date with the command line (src/cli.rs and the option groups \
             it flattens); first difference at line {line}:\n  {OPTIONS_PAGE}: {}\n  \
             rendered from the code: {}\nRegenerate it with `{BLESS_ENV}=1 cargo test --test docs` \
             and commit the result.",
            at(&on_disk),
            at(&rendered)
        );
    }
}

/// 1-based number of the first line where the two texts differ (one past the last line when
/// one text is the other plus more lines or a different ending).
fn first_different_line(a: &str, b: &str) -> usize {
    let same = a.lines().zip(b.lines()).take_while(|(x, y)| x == y).count();
    same + 1
}

/// The whole page.
fn render() -> String {
    let mut root = Cli::command();
    root.build();
    let mut sections = Vec::new();
    collect(&root, &[], &mut sections);

    let mut page = String::new();
    page.push_str("# Command-line options\n\n");
    page.push_str(
        "<!-- Generated from the clap definitions by tests/docs; do not edit by hand.\n     \
         Regenerate with: NIGHTSHIFT_BLESS=1 cargo test --test docs -->\n\n",
    );
    page.push_str(
        "An option with a variable in the env column may be set either way; a flag given on the \
         command line wins over its variable, which wins over the default. Durations are written with a unit: \
         `500ms`, `30s`, `2m`, `1h 30m`. `nightshift <subcommand> --help` prints the same options with their full help.\n\n",
    );
    for section in &sections {
        let _ = writeln!(page, "- [{}](#{})", section.title, section.anchor);
    }
    for section in &sections {
        page.push('\n');
        page.push_str(&section.body);
    }
    page
}

/// One rendered subcommand.
struct Section {
    title: String,
    anchor: String,
    body: String,
}

/// Renders `command` (the root's global options, or a subcommand's own ones), then its
/// subcommands, depth first in definition order.
fn collect(command: &Command, parents: &[&str], sections: &mut Vec<Section>) {
    let mut path: Vec<&str> = parents.to_vec();
    path.push(command.get_name());
    let is_root = parents.is_empty();
    let title = if is_root {
        "Global options".to_string()
    } else {
        format!("`{}`", path.join(" "))
    };
    let anchor = if is_root {
        "global-options".to_string()
    } else {
        path.join("-")
    };

    let mut body = format!("## {title}\n\n");
    if is_root {
        body.push_str("Accepted by every subcommand, before or after its name.\n\n");
    } else if let Some(about) = command.get_about() {
        let _ = writeln!(body, "{}\n", first_line(&about.to_string()));
    }
    let rows: Vec<String> = command
        .get_arguments()
        .filter(|arg| shown(arg, is_root))
        .map(row)
        .collect();
    if rows.is_empty() {
        let subcommands: Vec<String> = command
            .get_subcommands()
            .filter(|sub| !is_generated_help(sub))
            .map(|sub| format!("[`{}`](#{}-{})", sub.get_name(), anchor, sub.get_name()))
            .collect();
        let _ = writeln!(
            body,
            "No options of its own; subcommands: {}.",
            subcommands.join(", ")
        );
    } else {
        body.push_str("| flag | env | default | meaning |\n| --- | --- | --- | --- |\n");
        for row in rows {
            body.push_str(&row);
        }
    }
    sections.push(Section {
        title,
        anchor,
        body,
    });

    for sub in command
        .get_subcommands()
        .filter(|sub| !is_generated_help(sub))
    {
        collect(sub, &path, sections);
    }
}

/// clap's own `help` subcommand, which `build()` adds beside every group of subcommands
/// (nightshift defines no subcommand of that name).
fn is_generated_help(command: &Command) -> bool {
    command.get_name() == "help"
}

/// Whether `arg` gets a row: visible, not clap's own help/version, and global options only in
/// the root's section (clap copies them into every subcommand).
fn shown(arg: &Arg, is_root: bool) -> bool {
    let builtin = matches!(arg.get_action(), ArgAction::Help | ArgAction::Version)
        || matches!(arg.get_action(), ArgAction::HelpShort | ArgAction::HelpLong);
    !arg.is_hide_set() && !builtin && (is_root || !arg.is_global_set())
}

/// `| flag | env | default | meaning |` for one option.
fn row(arg: &Arg) -> String {
    let flag = match (arg.get_long(), arg.get_short()) {
        (Some(long), Some(short)) => format!("`--{long}`, `-{short}`"),
        (Some(long), None) => format!("`--{long}`"),
        (None, Some(short)) => format!("`-{short}`"),
        (None, None) => format!("`<{}>`", arg.get_id()),
    };
    let env = arg
        .get_env()
        .map(|env| format!("`{}`", env.to_string_lossy()))
        .unwrap_or_default();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| value.to_string_lossy().into_owned())
        .collect();
    let default = match defaults.as_slice() {
        [] => String::new(),
        [only] if only.is_empty() => "(empty)".to_string(),
        values => format!("`{}`", values.join(",")),
    };
    let mut meaning = arg
        .get_help()
        .map(|help| first_line(&help.to_string()))
        .unwrap_or_default();
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|value| !value.is_hide_set())
        .map(|value| format!("`{}`", value.get_name()))
        .collect();
    if !choices.is_empty() && takes_a_value(arg) && !is_boolean(&choices) {
        let _ = write!(meaning, " (one of {})", choices.join(", "));
    }
    format!(
        "| {} | {} | {} | {} |\n",
        cell(&flag),
        cell(&env),
        cell(&default),
        cell(meaning.trim())
    )
}

/// Whether the option is given a value (a switch like `--json` is not).
fn takes_a_value(arg: &Arg) -> bool {
    !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    )
}

/// `true`/`false` choices, which the help already implies.
fn is_boolean(choices: &[String]) -> bool {
    choices
        .iter()
        .all(|choice| choice == "`true`" || choice == "`false`")
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_string()
}

/// A table cell: a `|` would end the cell early.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}
