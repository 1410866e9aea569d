//! The two maps of the code say the same: every top-level entry of `src/` is in the README's
//! code map, every entry the code map names under `src/` exists, and every module `lib.rs`
//! declares is named in `lib.rs`'s own map (its `//!` comment) and in the README's.

use std::collections::BTreeSet;

use crate::repo_root;

/// Checks both maps against the tree and fails once, listing every disagreement.
pub fn check() {
    let readme = read("README.md");
    let lib = read("src/lib.rs");
    let on_disk = src_entries();
    let in_readme = readme_src_entries(&readme);
    let mut problems = Vec::new();
    for entry in on_disk.difference(&in_readme) {
        problems.push(format!("src/{entry} is missing from README.md's code map"));
    }
    for entry in in_readme.difference(&on_disk) {
        problems.push(format!(
            "README.md's code map names src/{entry}, which does not exist"
        ));
    }
    let lib_doc: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    for module in declared_modules(&lib) {
        if !lib_doc.contains(&format!("`{module}`")) {
            problems.push(format!("module {module} is missing from src/lib.rs's map"));
        }
        let entry = format!("{module}/");
        if !in_readme.contains(&entry) && !in_readme.contains(&format!("{module}.rs")) {
            problems.push(format!(
                "module {module} is missing from README.md's code map"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the code maps disagree:\n{}",
        problems.join("\n")
    );
}

fn read(path: &str) -> String {
    let path = repo_root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `src/`'s files and folders, folders with a trailing `/`.
fn src_entries() -> BTreeSet<String> {
    let dir = repo_root().join("src");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())))
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() {
                format!("{name}/")
            } else {
                name
            }
        })
        .collect()
}

/// The entries the README's code map lists under `src/`: the first word of each line indented
/// below `src/` in the `text` block that starts with it.
fn readme_src_entries(readme: &str) -> BTreeSet<String> {
    let mut lines = readme.lines().skip_while(|l| *l != "src/");
    assert!(
        lines.next().is_some(),
        "README.md has no code map starting with a `src/` line"
    );
    lines
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|word| word.ends_with('/') || word.ends_with(".rs"))
        .map(str::to_string)
        .collect()
}

/// The modules `lib.rs` declares (`pub mod x;`, `mod x;`).
fn declared_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .map(str::trim)
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_module_left_out_of_a_map_is_found() {
    let lib = "//! - [`core`]: the floor.\npub mod core;\npub mod pool;\n";
    let doc: Vec<_> = declared_modules(lib);
    assert_eq!(doc, ["core", "pool"]);
    let readme = "```text\nsrc/\n  core/   pure\n  main.rs  entry\n                 wrapped words\ntests/\n```";
    let entries = readme_src_entries(readme);
    assert_eq!(
        entries,
        BTreeSet::from(["core/".to_string(), "main.rs".to_string()])
    );
}
