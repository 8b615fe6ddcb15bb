//! The engine's stages import one way: model, then plan, then compile, then run, then observe.
//!
//! Read from the sources themselves, so a new `use` that points backwards — the plan type
//! importing its drawing, a program importing the executor's error — fails here, naming the
//! file and the line, instead of surfacing later as a circle nobody meant.

use std::fs;
use std::path::{Path, PathBuf};

/// The stages, in the only order their arrows may run.
const STAGES: [&str; 5] = ["model", "plan", "compile", "run", "observe"];

fn stage_of(source: &Path, root: &Path) -> Option<usize> {
    let relative = source.strip_prefix(root).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    STAGES.iter().position(|stage| *stage == name)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("the sources are readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
}

/// Every `crate::<stage>` a line of code names (comments and doc comments left out).
fn named_stages(line: &str) -> Vec<usize> {
    let code = line.split("//").next().unwrap_or("");
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if let Some(stage) = STAGES.iter().position(|stage| *stage == name) {
            found.push(stage);
        }
    }
    found
}

#[test]
fn every_stage_imports_only_the_stages_before_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    let mut backwards = Vec::new();
    let mut checked = 0;
    for file in &files {
        let Some(stage) = stage_of(file, &root) else {
            continue; // lib.rs: the crate root re-exports every stage.
        };
        let text = fs::read_to_string(file).expect("a source file");
        for (number, line) in text.lines().enumerate() {
            for named in named_stages(line) {
                checked += 1;
                if named > stage {
                    backwards.push(format!(
                        "{}:{}: `{}` imports `{}`",
                        file.strip_prefix(&root).unwrap().display(),
                        number + 1,
                        STAGES[stage],
                        STAGES[named]
                    ));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "the scan found only {checked} imports: is it reading the sources?"
    );
    assert!(backwards.is_empty(), "{}", backwards.join("\n"));
}

#[test]
fn the_layer_check_sees_a_backward_import() {
    assert_eq!(named_stages("use crate::observe::layout::svg;"), vec![4]);
    assert_eq!(
        named_stages("use crate::model::id::NodeId; // crate::run"),
        vec![0]
    );
    assert!(named_stages("/// see [`crate::Program`]").is_empty());
}
