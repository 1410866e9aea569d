//! Every fuzz target's checks on every committed input, with the stable toolchain and no
//! instrumented build (docs/fuzzing.md, "Replay in every test run"): for each target in
//! `fuzz/fuzz_targets/`, its function in `nightshift::test_support::fuzz` runs on every file in
//! `fuzz/seeds/<target>/` and, where a fuzzing run grew one, `fuzz/corpus/<target>/`. A test
//! fails listing every input that panics, by file name; it fails too when the target has no
//! seeds, and a target without a test here fails `every_fuzz_target_has_a_replay_test`.

use std::{
    fs,
    panic::{self, RefUnwindSafe},
    path::{Path, PathBuf},
};

/// One test per target, `<target>::replays_every_committed_input`, and the list of the targets
/// replayed.
macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        $(
            mod $target {
                #[test]
                fn replays_every_committed_input() {
                    super::replay_target(
                        super::fuzz_dir(),
                        stringify!($target),
                        nightshift::test_support::fuzz::$target,
                    );
                }
            }
        )*

        /// The targets with a replay test.
        const REPLAYED: &[&str] = &[$(stringify!($target)),*];
    };
}

replay_tests!(
    admission,
    exposition,
    prometheus_answer,
    scenario_toml,
    trace_csv,
    trigger_metadata,
);

/// The fuzz crate: its targets, seeds and the corpus fuzzing runs grow.
fn fuzz_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz"))
}

/// Runs `check` on every seed of `target` under `fuzz` and every input of its corpus, if there
/// is one; panics listing every input that fails, or when the target has no seeds. Returns how
/// many inputs passed.
fn replay_target(fuzz: &Path, target: &str, check: impl Fn(&[u8]) + RefUnwindSafe) -> usize {
    let seeds = fuzz.join("seeds").join(target);
    let mut inputs = files_in(&seeds);
    assert!(
        !inputs.is_empty(),
        "no seeds in {} for the fuzz target `{target}`: every target replays its committed seeds",
        seeds.display()
    );
    let seed_count = inputs.len();
    let corpus = fuzz.join("corpus").join(target);
    if corpus.is_dir() {
        inputs.extend(files_in(&corpus));
    }
    let failures = replay(&inputs, check);
    assert!(
        failures.is_empty(),
        "{} of {} inputs fail the checks of the fuzz target `{target}`:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
    println!(
        "{target}: {} inputs ({seed_count} seeds, {} from the corpus)",
        inputs.len(),
        inputs.len() - seed_count
    );
    inputs.len()
}

/// The files in `dir`, sorted; panics when it cannot be listed (it does not exist).
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())))
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `check` on each input, catching its panic; returns one line per failing input: its
/// path, then the panic's message.
fn replay(inputs: &[PathBuf], check: impl Fn(&[u8]) + RefUnwindSafe) -> Vec<String> {
    let mut failures = Vec::new();
    for path in inputs {
        let data = fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        if let Err(payload) = panic::catch_unwind(|| check(&data)) {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(a panic without a message)".to_string());
            failures.push(format!("{}: {message}", path.display()));
        }
    }
    failures
}

#[test]
fn every_fuzz_target_has_a_replay_test() {
    let dir = fuzz_dir().join("fuzz_targets");
    let targets: Vec<String> = files_in(&dir)
        .iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .filter_map(|path| path.file_stem())
        .map(|stem| stem.to_string_lossy().into_owned())
        .collect();
    let mut replayed: Vec<String> = REPLAYED.iter().map(|t| t.to_string()).collect();
    replayed.sort();
    assert_eq!(
        targets,
        replayed,
        "the targets in {} and the replay tests in tests/fuzz.rs (`replay_tests!`) differ",
        dir.display()
    );
    // The fuzzer and the replay run the same checks.
    for target in &targets {
        let path = dir.join(format!("{target}.rs"));
        let source = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert!(
            source.contains(&format!("nightshift::test_support::fuzz::{target}(")),
            "{} does not call nightshift::test_support::fuzz::{target}, which its replay test runs",
            path.display()
        );
    }
}

/// A fuzz directory with `target`'s seeds `(name, contents)` and, when given, its corpus.
fn fuzz_tree(target: &str, seeds: &[(&str, &[u8])], corpus: &[(&str, &[u8])]) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("a temporary directory");
    for (dir, files) in [("seeds", seeds), ("corpus", corpus)] {
        let dir = root.path().join(dir).join(target);
        fs::create_dir_all(&dir).expect("create the directory");
        for (name, contents) in files {
            fs::write(dir.join(name), contents).expect("write an input");
        }
    }
    root
}

/// The check of the tests below: fails on the input `boom`.
fn fails_on_boom(data: &[u8]) {
    assert_ne!(data, b"boom", "the input is boom");
}

#[test]
fn a_failing_input_is_reported_by_its_file_name_and_message() {
    let root = fuzz_tree(
        "t",
        &[("fine", b"ok"), ("bad-seed", b"boom")],
        &[("from-corpus", b"boom"), ("also-fine", b"")],
    );
    let path = root.path();
    let failure = panic::catch_unwind(|| replay_target(path, "t", fails_on_boom))
        .expect_err("two inputs fail");
    let message = failure
        .downcast_ref::<String>()
        .expect("a formatted message");
    assert!(
        message.starts_with("2 of 4 inputs fail the checks of the fuzz target `t`:\n"),
        "{message}"
    );
    for name in ["seeds/t/bad-seed: ", "corpus/t/from-corpus: "] {
        assert!(message.contains(name), "{name} missing from: {message}");
    }
    assert!(message.contains("the input is boom"), "{message}");
    for name in ["seeds/t/fine", "corpus/t/also-fine"] {
        assert!(!message.contains(name), "{name} reported: {message}");
    }
}

#[test]
fn seeds_and_corpus_are_replayed() {
    let root = fuzz_tree("t", &[("a", b"1"), ("b", b"2")], &[("c", b"3")]);
    assert_eq!(replay_target(root.path(), "t", fails_on_boom), 3);
}

#[test]
#[should_panic(expected = "no seeds in")]
fn a_target_with_an_empty_seed_directory_fails() {
    let root = fuzz_tree("t", &[], &[("c", b"3")]);
    replay_target(root.path(), "t", fails_on_boom);
}

#[test]
#[should_panic(expected = "cannot list")]
fn a_target_without_a_seed_directory_fails() {
    let root = fuzz_tree("t", &[("a", b"1")], &[]);
    replay_target(root.path(), "renamed", fails_on_boom);
}
