//! The module structure as docs/DESIGN.md states it: data flows one way, so no two top-level
//! modules of src/ depend on each other, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module -> the top-level modules its non-test code names through `crate::`.
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().split("mod ").nth(1))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue; // test fixtures (src/backend/cuda/testdata): not Rust
            }
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let top = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            if !modules.contains(&top) {
                continue; // lib.rs, main.rs
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let code = code.as_str();
            deps.entry(top.clone())
                .or_default()
                .extend(names_used(code, &top, &modules));
        }
    }
    deps
}

/// The top-level modules (other than `top`) that `code` names: `crate::m`, `use crate::{..}`
/// lists, and the printing macros, which are console's.
fn names_used(code: &str, top: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut uses = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let name: String = code[i + 7..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        uses.insert(name);
    }
    for (i, _) in code.match_indices("crate::{") {
        uses.extend(top_level_items(&code[i + 8..]));
    }
    if code.contains("outln!(") || code.contains("out!(") {
        uses.insert("console".to_string());
    }
    uses.retain(|n| modules.contains(n) && n != top);
    uses
}

/// The first path segment of each item of a `{...}` list that starts `text` (after the `{`),
/// up to its matching `}`.
fn top_level_items(text: &str) -> Vec<String> {
    let (mut depth, mut item, mut items) = (0, String::new(), Vec::new());
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(std::mem::take(&mut item)),
            _ if depth == 0 => item.push(c),
            _ => {}
        }
    }
    items.push(item);
    items
        .iter()
        .map(|i| i.trim().split("::").next().unwrap().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

#[test]
fn the_dependency_reader_sees_paths_nested_lists_and_macros() {
    assert_eq!(
        top_level_items("a, b::{c, d::{e}}, f::g} h"),
        ["a", "b", "f"]
    );
    let deps = dependencies();
    for (from, to) in [
        ("analysis", "verdict"),  // use crate::verdict::Verdict
        ("runner", "backend"),    // use crate::backend::{Backend, BackendError}
        ("commands", "analysis"), // through a nested list in commands/run.rs
        ("repeat", "console"),    // crate::outln! only
    ] {
        assert!(
            deps[from].contains(to),
            "{from} -> {to} not seen: {:?}",
            deps[from]
        );
    }
}

#[test]
fn no_two_top_level_modules_depend_on_each_other() {
    let deps = dependencies();
    assert!(deps.len() > 20, "found the modules: {deps:?}");
    for (module, direct) in &deps {
        // Everything reachable from `module`; reaching `module` again is a cycle.
        let mut seen = BTreeSet::new();
        let mut path: Vec<&String> = direct.iter().collect();
        while let Some(m) = path.pop() {
            assert_ne!(
                m, module,
                "a dependency cycle through `{module}`: {module} -> {direct:?} -> ... -> {module}"
            );
            if seen.insert(m.clone()) {
                path.extend(deps.get(m).into_iter().flatten());
            }
        }
    }
}
