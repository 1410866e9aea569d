//! Relative links in the Markdown pages: every `[text](target)` that is not a web address must
//! name an existing file, and a `#fragment` into a Markdown page must name one of its headings
//! (GitHub's anchors). Code blocks and inline code are not links.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::repo_root;

/// Checks every page and fails once, listing every broken link.
pub fn check(pages: &[PathBuf]) {
    let mut anchors = HashMap::new();
    let mut broken = Vec::new();
    for page in pages {
        let text = read(page);
        for (line, target) in links(&text) {
            if let Some(problem) = problem(page, &target, &mut anchors) {
                broken.push(format!("{}:{line}: ({target}) {problem}", shown(page)));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken relative links:\n{}",
        broken.join("\n")
    );
}

/// What is wrong with `target` as written in `page`, if anything.
fn problem(
    page: &Path,
    target: &str,
    anchors: &mut HashMap<PathBuf, Vec<String>>,
) -> Option<String> {
    if is_external(target) {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        let dir = page.parent().unwrap_or(repo_root());
        dir.join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", shown(&file)));
    }
    if !inside_the_repository(&file) {
        return Some(format!("{} is outside the repository", file.display()));
    }
    let fragment = fragment?;
    if file.extension().is_none_or(|ext| ext != "md") {
        return None;
    }
    let key = file.canonicalize().unwrap_or_else(|_| file.clone());
    let known = anchors
        .entry(key)
        .or_insert_with(|| heading_anchors(&read(&file)));
    if known.iter().any(|anchor| anchor == fragment) {
        None
    } else {
        Some(format!(
            "{} has no heading with anchor #{fragment}",
            shown(&file)
        ))
    }
}

/// Whether an existing `path` lies in the repository (a link that leaves it breaks on any other
/// checkout).
fn inside_the_repository(path: &Path) -> bool {
    match (path.canonicalize(), repo_root().canonicalize()) {
        (Ok(path), Ok(root)) => path.starts_with(root),
        _ => false,
    }
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// `(line number, target)` of every inline link and image, and of every reference definition
/// (`[label]: target`), outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_inline_code(line);
        if let Some(target) = reference_definition(&line) {
            found.push((number, target));
        }
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            let target = target.trim_start_matches('<').trim_end_matches('>');
            if !target.is_empty() {
                found.push((number, target.to_string()));
            }
            rest = &after[end..];
        }
    }
    found
}

/// `[label]: target` at the start of a line.
fn reference_definition(line: &str) -> Option<String> {
    let trimmed = line.trim_start();
    let rest = trimmed.strip_prefix('[')?;
    let (_, after) = rest.split_once("]:")?;
    after.split_whitespace().next().map(str::to_string)
}

/// The 1-based numbered lines of `text` outside fenced code blocks.
pub fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"]
            .into_iter()
            .find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker => fence = None,
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// `line` with the contents of `code spans` removed.
fn without_inline_code(line: &str) -> String {
    line.split('`')
        .enumerate()
        .filter(|(index, _)| index % 2 == 0)
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join("``")
}

/// GitHub's anchors for the headings of a Markdown page, duplicates numbered `-1`, `-2`, ...
pub fn heading_anchors(text: &str) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::new();
    for (_, line) in prose_lines(text) {
        let Some(title) = heading_title(line) else {
            continue;
        };
        let base = slug(title);
        let mut anchor = base.clone();
        let mut copies = 0;
        while anchors.contains(&anchor) {
            copies += 1;
            anchor = format!("{base}-{copies}");
        }
        anchors.push(anchor);
    }
    anchors
}

/// The title of an ATX heading (`## Title`).
fn heading_title(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    rest.starts_with(' ').then(|| rest.trim())
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (except `-` and `_`), spaces
/// turned into `-`.
pub fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", shown(path)))
}

/// `path` relative to the repository root, for messages.
pub fn shown(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_follow_github() {
        assert_eq!(slug("End-to-end tests"), "end-to-end-tests");
        assert_eq!(
            slug("GPU pool: spare GPUs, marks and `nightshift status`"),
            "gpu-pool-spare-gpus-marks-and-nightshift-status"
        );
        assert_eq!(
            slug("`nightshift certs generate`"),
            "nightshift-certs-generate"
        );
        assert_eq!(slug("Status: `/status` and more"), "status-status-and-more");
    }

    #[test]
    fn links_in_code_are_not_links() {
        let text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d]: d.md\n";
        let targets: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
        assert_eq!(targets, ["a.md", "d.md"]);
    }
}
