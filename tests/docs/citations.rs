//! Comments in the code cite the manual by heading: `docs/<page>.md, "<Heading>"`,
//! `docs/<page>.md ("<Heading>")` or `docs/<page>.md#<anchor>`. Every such citation in the
//! sources (`src/`, `benches/`, `tests/`, `fuzz/`, `.ci/` and `Cargo.toml`) must name a page that
//! exists and one of its headings, so that a heading renamed or removed shows every comment that
//! still cites it. A heading is matched by its anchor, as a link to it would be, so case and
//! punctuation may differ; a quoted heading may wrap onto the next comment line.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::{
    links::{heading_anchors, slug},
    repo_root,
};

/// Where citations are looked for, relative to the repository root.
const SOURCES: &[&str] = &["src", "benches", "tests", "fuzz", ".ci", "Cargo.toml"];

/// What builds and fuzzing runs write there, never cited from (and large).
const GENERATED: &[&str] = &[
    "fuzz/target",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/coverage",
];

/// Lines a quoted heading may run on to after the citation's own.
const WRAPPED_LINES: usize = 2;

/// One citation: the page as written from the repository root, and what of it is cited.
#[derive(Debug, PartialEq)]
struct Citation {
    line: usize,
    page: String,
    cited: Cited,
}

#[derive(Debug, PartialEq)]
enum Cited {
    Heading(String),
    Anchor(String),
    /// A quote opened after the page that does not close within [`WRAPPED_LINES`].
    Unclosed,
}

/// Checks every source file and fails once, listing every citation that names no heading.
pub fn check() {
    let root = repo_root();
    let mut files = Vec::new();
    for source in SOURCES {
        collect(root, &root.join(source), &mut files);
    }
    files.sort();
    let broken = broken_citations(root, &files);
    assert!(
        broken.is_empty(),
        "citations of the manual in the code that name no heading of the page (point them at a \
         heading that exists, or change the page):\n{}",
        broken.join("\n")
    );
}

/// Every file under `path` (or `path` itself), leaving out what [`GENERATED`] names.
fn collect(root: &Path, path: &Path, files: &mut Vec<PathBuf>) {
    let relative = path.strip_prefix(root).unwrap_or(path);
    if GENERATED
        .iter()
        .any(|skipped| relative == Path::new(skipped))
    {
        return;
    }
    if path.is_file() {
        files.push(path.to_path_buf());
    } else if path.is_dir() {
        let entries = std::fs::read_dir(path)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", path.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", path.display()));
            collect(root, &entry.path(), files);
        }
    }
}

/// `file:line: problem` for every citation in `files` whose page or heading does not exist,
/// pages read from under `root`. Files that are not UTF-8 text are skipped.
fn broken_citations(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut pages: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut broken = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for citation in citations(&text) {
            let anchors = pages.entry(citation.page.clone()).or_insert_with(|| {
                std::fs::read_to_string(root.join(&citation.page))
                    .ok()
                    .map(|page| heading_anchors(&page))
            });
            if let Some(problem) = problem(&citation, anchors.as_deref()) {
                let shown = file.strip_prefix(root).unwrap_or(file).display();
                broken.push(format!("{shown}:{}: {problem}", citation.line));
            }
        }
    }
    broken
}

/// What is wrong with `citation`, given the anchors of its page (`None`: no such page).
fn problem(citation: &Citation, anchors: Option<&[String]>) -> Option<String> {
    let page = &citation.page;
    let Some(anchors) = anchors else {
        return Some(format!("{page} does not exist"));
    };
    match &citation.cited {
        Cited::Heading(heading) if anchors.contains(&slug(heading)) => None,
        Cited::Heading(heading) => Some(format!("{page} has no heading \"{heading}\"")),
        Cited::Anchor(anchor) if anchors.contains(anchor) => None,
        Cited::Anchor(anchor) => Some(format!("{page} has no heading with anchor #{anchor}")),
        Cited::Unclosed => Some(format!(
            "{page} cited with a quoted heading that does not close within {} lines",
            WRAPPED_LINES + 1
        )),
    }
}

/// Every citation of a page under `docs/` in `text`, with its 1-based line.
fn citations(text: &str) -> Vec<Citation> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("docs/") {
            let start = from + at;
            from = start + "docs/".len();
            let glued = line[..start]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
            if glued {
                continue;
            }
            let rest = &line[from..];
            let name = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c)))
                .unwrap_or(rest.len());
            let Some(after) = rest[name..].strip_prefix(".md") else {
                continue;
            };
            if name == 0 {
                continue;
            }
            let cited = if let Some(anchor) = after.strip_prefix('#') {
                let end = anchor
                    .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
                    .unwrap_or(anchor.len());
                if end == 0 {
                    continue;
                }
                Cited::Anchor(anchor[..end].to_string())
            } else if let Some(quoted) = after
                .strip_prefix(", \"")
                .or_else(|| after.strip_prefix(" (\""))
            {
                quoted_heading(quoted, &lines[index + 1..]).map_or(Cited::Unclosed, Cited::Heading)
            } else {
                continue;
            };
            found.push(Citation {
                line: index + 1,
                page: format!("docs/{}.md", &rest[..name]),
                cited,
            });
        }
    }
    found
}

/// The heading that starts `first` and ends at the next `"`, on this line or the next
/// [`WRAPPED_LINES`] (their comment markers dropped), its spaces collapsed.
fn quoted_heading(first: &str, following: &[&str]) -> Option<String> {
    let mut heading = String::new();
    let mut part = first;
    let mut following = following.iter().take(WRAPPED_LINES);
    loop {
        if let Some(end) = part.find('"') {
            heading.push_str(&part[..end]);
            return Some(heading.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        heading.push_str(part);
        heading.push(' ');
        part = without_comment_marker(following.next()?);
    }
}

/// `line` without its indentation and the comment marker that opens it (`//!`, `///`, `//`,
/// `#`, `*`), if any.
fn without_comment_marker(line: &str) -> &str {
    let line = line.trim_start();
    ["//!", "///", "//", "#", "*"]
        .iter()
        .find_map(|marker| line.strip_prefix(marker))
        .unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` with `DOCS/` for `docs/`, so that the examples here are not citations of this
    /// file's own.
    fn cited(text: &str) -> Vec<Citation> {
        citations(&text.replace("DOCS/", "docs/"))
    }

    fn heading(line: usize, page: &str, heading: &str) -> Citation {
        Citation {
            line,
            page: page.to_string(),
            cited: Cited::Heading(heading.to_string()),
        }
    }

    #[test]
    fn the_three_forms_are_found_and_a_bare_page_or_other_path_is_not() {
        let text = "/// glibc (DOCS/perf.md, \"Where a review's CPU goes\").\n\
                    // see DOCS/perf.md (\"At a glance\") and DOCS/pool.md#gpu-pool.\n\
                    # DOCS/perf.md alone, mydocs/x.md, \"no\", DOCS/<page>.md, \"Heading\"\n";
        assert_eq!(
            cited(text),
            [
                heading(1, "docs/perf.md", "Where a review's CPU goes"),
                heading(2, "docs/perf.md", "At a glance"),
                Citation {
                    line: 2,
                    page: "docs/pool.md".to_string(),
                    cited: Cited::Anchor("gpu-pool".to_string()),
                },
            ]
        );
    }

    #[test]
    fn a_heading_wrapped_onto_the_next_comment_line_is_read_whole() {
        let text = "//! on the machine of DOCS/perf.md (\"Reviews taken in\n\
                    //! turn\") the rate went up\n\
                    # Cargo (DOCS/perf.md, \"Where a\n\
                    #   review's CPU goes\").\n\
                    // DOCS/perf.md, \"never\n// closed\n// here\n// at all\n";
        assert_eq!(
            cited(text),
            [
                heading(1, "docs/perf.md", "Reviews taken in turn"),
                heading(3, "docs/perf.md", "Where a review's CPU goes"),
                Citation {
                    line: 5,
                    page: "docs/perf.md".to_string(),
                    cited: Cited::Unclosed,
                },
            ]
        );
    }

    #[test]
    fn only_citations_of_missing_headings_or_pages_are_reported() {
        let root = tempfile::tempdir().expect("temporary directory");
        let root = root.path();
        std::fs::create_dir_all(root.join("docs")).expect("docs");
        std::fs::create_dir_all(root.join("src")).expect("src");
        std::fs::write(
            root.join("docs/perf.md"),
            "# Performance\n\n## At a glance\n\n### Admission webhook\n\n```\n## Not a heading\n```\n",
        )
        .expect("page");
        let source = "// DOCS/perf.md, \"Admission webhook\": exists\n\
                      // DOCS/perf.md (\"admission Webhook\"): exists, by its anchor\n\
                      // DOCS/perf.md#at-a-glance: exists\n\
                      // DOCS/perf.md (\"Reviews taken in\n\
                      // turn\"): gone\n\
                      // DOCS/perf.md, \"Not a heading\": in a code block\n\
                      // DOCS/perf.md#where-a-reviews-cpu-goes: gone\n\
                      // DOCS/gone.md, \"Anything\": no such page\n\
                      // DOCS/perf.md alone: not a citation of a heading\n";
        let file = root.join("src/a.rs");
        std::fs::write(&file, source.replace("DOCS/", "docs/")).expect("source");
        let mut files = Vec::new();
        collect(root, &root.join("src"), &mut files);
        assert_eq!(
            broken_citations(root, &files),
            [
                "src/a.rs:4: docs/perf.md has no heading \"Reviews taken in turn\"",
                "src/a.rs:6: docs/perf.md has no heading \"Not a heading\"",
                "src/a.rs:7: docs/perf.md has no heading with anchor #where-a-reviews-cpu-goes",
                "src/a.rs:8: docs/gone.md does not exist",
            ]
        );
    }

    #[test]
    fn generated_fuzz_directories_are_left_out() {
        let root = tempfile::tempdir().expect("temporary directory");
        let root = root.path();
        for dir in [
            "fuzz/target/debug",
            "fuzz/corpus/admission",
            "fuzz/fuzz_targets",
        ] {
            std::fs::create_dir_all(root.join(dir)).expect("directory");
        }
        std::fs::write(root.join("fuzz/target/debug/a.rs"), "").expect("file");
        std::fs::write(root.join("fuzz/corpus/admission/b"), "").expect("file");
        std::fs::write(root.join("fuzz/fuzz_targets/c.rs"), "").expect("file");
        let mut files = Vec::new();
        collect(root, &root.join("fuzz"), &mut files);
        assert_eq!(files, [root.join("fuzz/fuzz_targets/c.rs")]);
    }
}
