//! The pages' prose renders as written: a wrapped line of figures that happens to start with
//! `+ ` (a signed figure, "+ 4 µs") is a list item to Markdown, which cuts the paragraph in two
//! and shows the figure as a bullet. The pages write their lists with `-`, so a prose line that
//! opens with `+ ` is always such an accident.

use std::path::PathBuf;

use crate::links::{prose_lines, read, shown};

/// Checks every page and fails once, listing every such line.
pub fn check(pages: &[PathBuf]) {
    let mut stray = Vec::new();
    for page in pages {
        let text = read(page);
        for (line, _) in stray_list_items(&text) {
            stray.push(format!("{}:{line}", shown(page)));
        }
    }
    assert!(
        stray.is_empty(),
        "prose lines that start with `+ ` and so render as list items (move the figure's \
         preceding word to the line's start):\n{}",
        stray.join("\n")
    );
}

/// The numbered prose lines of `text` (outside fenced code) that open with `+ `.
fn stray_list_items(text: &str) -> Vec<(usize, &str)> {
    prose_lines(text)
        .into_iter()
        .filter(|(_, line)| line.trim_start().starts_with("+ "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_signed_figure_is_found_and_code_is_not() {
        let text = "CPU the floor's\n+ 4 µs, and - 2 µs\nto + 5 µs\n```\n+ 1\n```\n";
        let lines: Vec<usize> = stray_list_items(text)
            .into_iter()
            .map(|(line, _)| line)
            .collect();
        assert_eq!(lines, [2]);
    }
}
