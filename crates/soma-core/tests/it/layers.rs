//! The engine's stages import one way: model, then plan, then compile, then run, then observe;
//! and inside a stage — and inside each folder of it (`run/aio`, `run/sync`), none left out — its
//! modules import one another one way too.
//!
//! Read from the sources themselves, so a new `use` that points backwards — the plan type
//! importing its drawing, a program importing the executor's error — fails here, naming the
//! file and the line, instead of surfacing later as a circle nobody meant. A circle between two
//! modules of one stage (the crew starting threads the reserve keeps, the reserve refilling
//! through the crew) fails the same way, naming each arrow of the circle.

use std::collections::BTreeMap;
use std::fmt::Write as _;
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

/// Every module of `stage` a line of code in that stage names: `super::<module>` or
/// `crate::<stage>::<module>` (comments and doc comments left out; `super::*` and items of the
/// stage's own `mod.rs` are no module).
fn named_modules(line: &str, stage: &str, modules: &[String]) -> Vec<String> {
    named_modules_from(line, "super::", stage, modules)
}

/// As [`named_modules`], for a line of a file from which `up` (`super::`, or `super::super::` in
/// a file inside a module's folder) is the path back to the stage.
fn named_modules_from(line: &str, up: &str, stage: &str, modules: &[String]) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let within = format!("crate::{stage}::");
    let mut found = Vec::new();
    for prefix in [up, within.as_str()] {
        for (at, _) in code.match_indices(prefix) {
            if prefix == up && code[..at].ends_with("::") {
                continue; // `crate::run::super::` is no path; `x::super::` is not ours.
            }
            let rest = &code[at + prefix.len()..];
            let heads: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group
                    .split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(str::trim)
                    .collect(),
                None => vec![rest],
            };
            for head in heads {
                let name: String = head
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if modules.contains(&name) && !found.contains(&name) {
                    found.push(name);
                }
            }
        }
    }
    found
}

/// One stage's modules and, for each, the modules it names, with the first line naming each.
type ModuleGraph = BTreeMap<String, BTreeMap<String, String>>;

/// The modules of a folder — a stage that is a directory (`run/`), or a module that is one
/// (`run/aio/`), whose path from the crate's root is `stage` (`run`, `run::aio`) — and their
/// arrows, read from its files: a module is a file (`crew.rs`) or a folder with a `mod.rs`
/// (`stream/`), every file inside the folder counting as the module's own.
fn module_graph(stage_dir: &Path, stage: &str) -> ModuleGraph {
    let mut entries: Vec<PathBuf> = fs::read_dir(stage_dir)
        .expect("the stage's directory is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            if path.is_dir() {
                path.join("mod.rs").is_file()
            } else {
                path.extension().is_some_and(|e| e == "rs")
                    && path.file_name().is_some_and(|name| name != "mod.rs")
            }
        })
        .collect();
    entries.sort();
    let modules: Vec<String> = entries
        .iter()
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut graph = ModuleGraph::new();
    for (entry, module) in entries.iter().zip(&modules) {
        let arrows = graph.entry(module.clone()).or_default();
        let mut files = Vec::new();
        if entry.is_dir() {
            sources(entry, &mut files);
            files.sort();
        } else {
            files.push(entry.clone());
        }
        for file in files {
            // How many `super::` lead from the file back to the stage: one from `crew.rs` and
            // from `stream/mod.rs`, two from `stream/inbox.rs`, one more for each folder deeper.
            let relative = file.strip_prefix(stage_dir).unwrap();
            let mut depth = relative.components().count();
            if file.file_name().is_some_and(|name| name == "mod.rs") {
                depth -= 1;
            }
            let up = "super::".repeat(depth);
            let text = fs::read_to_string(&file).expect("a source file");
            for (number, line) in text.lines().enumerate() {
                for named in named_modules_from(line, &up, stage, &modules) {
                    if named != *module {
                        arrows.entry(named).or_insert_with(|| {
                            format!(
                                "{}/{}:{}",
                                stage.replace("::", "/"),
                                relative.display(),
                                number + 1
                            )
                        });
                    }
                }
            }
        }
    }
    graph
}

/// A circle of arrows in `graph`, as the modules along it (the first repeated at the end), or
/// `None` when its arrows all run one way. Depth-first with an explicit stack.
fn find_circle(graph: &ModuleGraph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Unseen,
        OnPath,
        Done,
    }
    let mut marks: BTreeMap<&str, Mark> =
        graph.keys().map(|m| (m.as_str(), Mark::Unseen)).collect();
    for start in graph.keys() {
        if marks[start.as_str()] != Mark::Unseen {
            continue;
        }
        // Each frame: a module on the path and the arrows of it still to follow.
        let mut path: Vec<(&str, Vec<&str>)> = Vec::new();
        let arrows_of = |module: &str| -> Vec<&str> {
            graph
                .get(module)
                .map(|arrows| arrows.keys().map(String::as_str).rev().collect())
                .unwrap_or_default()
        };
        marks.insert(start, Mark::OnPath);
        path.push((start, arrows_of(start)));
        while let Some((module, pending)) = path.last_mut() {
            let module = *module;
            let Some(next) = pending.pop() else {
                marks.insert(module, Mark::Done);
                path.pop();
                continue;
            };
            match marks.get(next).copied().unwrap_or(Mark::Done) {
                Mark::OnPath => {
                    let from = path.iter().position(|(m, _)| *m == next).unwrap();
                    let mut circle: Vec<String> =
                        path[from..].iter().map(|(m, _)| m.to_string()).collect();
                    circle.push(next.to_string());
                    return Some(circle);
                }
                Mark::Unseen => {
                    marks.insert(next, Mark::OnPath);
                    path.push((next, arrows_of(next)));
                }
                Mark::Done => {}
            }
        }
    }
    None
}

/// `crew -> reserve (run/crew.rs:74) -> crew (run/reserve.rs:21)`.
fn describe_circle(graph: &ModuleGraph, circle: &[String]) -> String {
    let mut said = circle[0].clone();
    for pair in circle.windows(2) {
        let line = &graph[&pair[0]][&pair[1]];
        write!(said, " -> {} ({line})", pair[1]).expect("writing to a string");
    }
    said
}

/// Every folder of modules under `dir`, whose path from the crate's root is `path`: `dir`
/// itself and each folder inside it with a `mod.rs`, with their paths (`run`, `run::aio`).
fn folders(dir: &Path, path: &str) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), path.to_string())];
    while let Some((dir, path)) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("the sources are readable") {
            let inner = entry.expect("a directory entry").path();
            if inner.is_dir() && inner.join("mod.rs").is_file() {
                let name = inner.file_name().unwrap().to_string_lossy().into_owned();
                pending.push((inner, format!("{path}::{name}")));
            }
        }
        found.push((dir, path));
    }
    found.sort();
    found
}

#[test]
fn the_modules_of_each_stage_import_one_another_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut circles = Vec::new();
    let mut arrows = 0;
    let mut folders_read = 0;
    for stage in STAGES {
        let dir = root.join(stage);
        if !dir.is_dir() {
            continue; // plan.rs: a stage of one module has no circle inside it.
        }
        // The stage's modules, and those of every folder inside it (`run/aio`, `run/sync`),
        // none left out: a circle at any depth fails here.
        for (folder, path) in folders(&dir, stage) {
            folders_read += 1;
            let graph = module_graph(&folder, &path);
            arrows += graph.values().map(BTreeMap::len).sum::<usize>();
            // Every circle, not only the first: each found is said, then its closing arrow
            // left out of the search, until the arrows that remain run one way.
            let mut remaining = graph.clone();
            while let Some(circle) = find_circle(&remaining) {
                circles.push(format!("{path}: {}", describe_circle(&graph, &circle)));
                let closing = &circle[circle.len() - 2..];
                remaining.get_mut(&closing[0]).unwrap().remove(&closing[1]);
            }
        }
    }
    assert!(
        arrows > 20 && folders_read > 5,
        "the scan found only {arrows} arrows between modules in {folders_read} folders: is it \
         reading the sources?"
    );
    assert!(
        circles.is_empty(),
        "modules of one stage import each other in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_check_sees_imports_between_modules_of_a_stage() {
    let modules: Vec<String> = ["crew", "reserve", "wave"].map(String::from).to_vec();
    assert_eq!(
        named_modules("use super::crew::{start_worker, STACK};", "run", &modules),
        vec!["crew"]
    );
    assert_eq!(
        named_modules(
            "use crate::run::program::{Op, Program};",
            "run",
            &["program".into()]
        ),
        vec!["program"]
    );
    assert_eq!(
        named_modules(
            "    crate::run::wave::Lane::new(super::reserve::take())",
            "run",
            &modules
        ),
        vec!["reserve", "wave"]
    );
    assert_eq!(
        named_modules("use super::{crew::Crew, wave};", "run", &modules),
        vec!["crew", "wave"]
    );
    assert!(named_modules("use super::*;", "run", &modules).is_empty());
    // Inside a module's folder (`run/stream/inbox.rs`), `super::` is that module, not the stage.
    let up = "super::super::";
    assert!(named_modules_from("use super::crew::Crew;", up, "run", &modules).is_empty());
    assert_eq!(
        named_modules_from("use super::super::crew::Crew;", up, "run", &modules),
        vec!["crew"]
    );
    assert_eq!(
        named_modules_from("use crate::run::wave::Lane;", up, "run", &modules),
        vec!["wave"]
    );
    assert!(named_modules("/// [`crate::run::crew`]", "run", &modules).is_empty());
    assert!(named_modules("use crate::model::crew::X;", "run", &modules).is_empty());
}

#[test]
fn the_circle_check_names_each_arrow_of_a_circle() {
    let mut graph = ModuleGraph::new();
    let mut arrow = |from: &str, to: &str, line: &str| {
        graph
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string(), line.to_string());
        graph.entry(to.to_string()).or_default();
    };
    arrow("error", "program", "run/error.rs:3");
    arrow("executor", "wave", "run/executor.rs:26");
    arrow("wave", "program", "run/wave.rs:20");
    arrow("program", "executor", "run/program.rs:9");
    let circle = find_circle(&graph).expect("a circle");
    assert_eq!(
        describe_circle(&graph, &circle),
        "program -> executor (run/program.rs:9) -> wave (run/executor.rs:26) \
         -> program (run/wave.rs:20)"
    );
    graph.get_mut("program").unwrap().clear();
    assert_eq!(find_circle(&graph), None, "the same arrows, one way");
}
