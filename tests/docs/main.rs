//! The documentation stays true to the code: `docs/options.md` is the rendering of the command
//! line's clap definitions, every relative link in `README.md` and `docs/*.md` leads to a file
//! (and heading) that exists, no wrapped line of their prose renders as a stray list item, and
//! every heading of the manual that a comment in the code cites exists, and the README's code
//! map and `lib.rs`'s map name every part of `src/`.
//!
//! After a change to a flag, regenerate the options page with
//! `NIGHTSHIFT_BLESS=1 cargo test --test docs` and commit it with the change.

mod citations;
mod code_map;
mod links;
mod options;
mod prose;

use std::path::{Path, PathBuf};

/// The repository root: every documentation path is relative to it.
fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every Markdown page under `docs/`, sorted so failures read the same each run.
fn markdown_pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    let docs = root.join("docs");
    let entries =
        std::fs::read_dir(&docs).unwrap_or_else(|e| panic!("cannot list {}: {e}", docs.display()));
    let mut in_docs: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", docs.display())))
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    in_docs.sort();
    pages.extend(in_docs);
    pages
}

#[test]
fn options_page_matches_the_command_line() {
    options::check_or_bless();
}

#[test]
fn relative_links_lead_to_existing_files_and_headings() {
    links::check(&markdown_pages());
}

#[test]
fn no_prose_line_renders_as_a_stray_list_item() {
    prose::check(&markdown_pages());
}

#[test]
fn headings_cited_in_the_code_exist() {
    citations::check();
}

#[test]
fn the_code_maps_name_every_part_of_src() {
    code_map::check();
}
