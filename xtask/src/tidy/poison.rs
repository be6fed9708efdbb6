//! One poison policy: a library's locks are `distribute_values::Lock`s, which a panicking holder
//! does not poison (the policy, and why it is sound, is the header of `crates/values/src/lock.rs`).
//! So no `src/` file of a workspace package but xtask handles poison itself, outside
//! [`EXCEPTIONS`]: it names no `Mutex` (a `Lock` is what it holds) and no `PoisonError`, unwraps
//! no lock's result (`.lock().unwrap()`, `.lock().expect(…)`, `.lock().unwrap_or_else(…)`) and
//! recovers no poisoned guard (`.unwrap_or_else(|e| e.into_inner())`, after a `lock`, a `wait`
//! or a mutex's own `into_inner`).
//!
//! Lexical ([`super::source`]): comments, strings and `#[cfg(test)]` items do not count, nor do
//! `tests/`, `benches/` and `examples/`, whose `.lock().unwrap()` is fine.

use std::path::Path;

use super::source::{Token, tokens, without_tests};

/// The files, or folders (ending in `/`), below the workspace root that keep their own poison
/// handling, and why. The test fails when one no longer does: remove it.
const EXCEPTIONS: &[(&str, &str)] = &[
    ("crates/values/src/lock.rs", "Lock itself"),
    (
        "crates/candle/src/data_parallel.rs",
        "a replica's model that a panic may have left half updated is refused with the typed \
         Error::Poisoned, never trained on",
    ),
    (
        "crates/candle/src/replica.rs",
        "candle's VarMap hands out its own std Mutex; the map is the builder's own, fresh, and \
         only read after the user's builder returned",
    ),
    (
        "crates/pjrt/",
        "depends on no workspace crate, so follows the same policy by hand",
    ),
];

/// The methods that unwrap a lock's `LockResult`.
const UNWRAPS: [&str; 3] = ["unwrap", "expect", "unwrap_or_else"];

/// What a file does about poison, each kind once, in the order they first appear.
fn poison_handling(text: &str) -> Vec<&'static str> {
    let t = without_tests(&tokens(text));
    let ident = |i: usize, name: &str| matches!(t.get(i), Some(Token::Ident(s)) if s == name);
    let punct = |i: usize, c: char| t.get(i) == Some(&Token::Punct(c));
    let mut found = Vec::new();
    for i in 0..t.len() {
        let what = if ident(i, "Mutex") {
            "names `Mutex`"
        } else if ident(i, "PoisonError") {
            "names `PoisonError`"
        } else if punct(i, '.')
            && ident(i + 1, "lock")
            && punct(i + 2, '(')
            && punct(i + 3, ')')
            && punct(i + 4, '.')
            && UNWRAPS.iter().any(|unwrap| ident(i + 5, unwrap))
        {
            "unwraps a lock's result"
        } else if ident(i, "unwrap_or_else")
            && punct(i + 1, '(')
            && punct(i + 2, '|')
            && matches!(t.get(i + 3), Some(Token::Ident(_)))
            && punct(i + 4, '|')
            && t.get(i + 5) == t.get(i + 3)
            && punct(i + 6, '.')
            && ident(i + 7, "into_inner")
        {
            "recovers a poisoned guard (`|e| e.into_inner()`)"
        } else {
            continue;
        };
        if !found.contains(&what) {
            found.push(what);
        }
    }
    found
}

/// What is wrong with `files` (path below the workspace root, text; the library `src/` files).
fn poison_violations(files: &[(String, String)]) -> Vec<String> {
    let excepted = |path: &str| {
        EXCEPTIONS.iter().any(|(exception, _)| {
            path == *exception || (exception.ends_with('/') && path.starts_with(exception))
        })
    };
    let mut violations = Vec::new();
    let mut handling = Vec::new();
    for (path, text) in files {
        let found = poison_handling(text);
        if found.is_empty() {
            continue;
        }
        handling.push(path.as_str());
        if !excepted(path) {
            violations.push(format!(
                "{path}: {}; hold a `distribute_values::Lock`, whose `lock` cannot fail (the one \
                 poison policy: crates/values/src/lock.rs)",
                found.join(", ")
            ));
        }
    }
    for (exception, why) in EXCEPTIONS {
        if !handling.iter().any(|path| path.starts_with(exception)) {
            violations.push(format!(
                "{exception}: handles no poison any more ({why}): remove it from the exceptions"
            ));
        }
    }
    violations
}

#[test]
fn no_library_handles_poison_but_the_exceptions() {
    let root = super::workspace_root();
    let mut paths = Vec::new();
    for package in super::library_packages() {
        super::rust_files(&package.manifest.parent().unwrap().join("src"), &mut paths);
    }
    paths.sort();
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|path| {
            let shown = path.strip_prefix(&root).unwrap_or(Path::new(path));
            (
                shown.to_string_lossy().replace('\\', "/"),
                std::fs::read_to_string(path).unwrap(),
            )
        })
        .collect();
    let violations = poison_violations(&files);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn poison_handling_is_found_outside_comments_strings_and_tests() {
    let file = |path: &str, text: &str| (path.to_owned(), text.to_owned());
    let files = [
        file(
            "crates/a/src/fine.rs",
            "use distribute_values::Lock;\nstruct S { slots: Lock<Vec<u8>> }\n\
             fn f(s: &S) { s.slots.lock().clear(); let g = s.slots.into_inner(); }\n\
             // m.lock().unwrap() and a Mutex, in a comment\nconst X: &str = \"PoisonError\";\n\
             #[cfg(test)]\nmod tests {\n    fn t(m: &std::sync::Mutex<u8>) {\n        \
             *m.lock().unwrap() = 1;\n    }\n}\n",
        ),
        file(
            "crates/a/src/declared.rs",
            "use std::sync::{Arc, Mutex};\nstruct S { m: Arc<Mutex<u8>> }\n",
        ),
        file(
            "crates/a/src/unwrapped.rs",
            "fn f(s: &S) { s.m.lock().unwrap(); s.m.lock().expect(\"held\"); }\n",
        ),
        file(
            "crates/a/src/recovered.rs",
            "fn f(s: &S) -> u8 { *s.m.lock().unwrap_or_else(|p| p.into_inner()) }\n\
             fn g(c: &Condvar, g: G) -> G { c.wait(g).unwrap_or_else(PoisonError::into_inner) }\n",
        ),
        file(
            "crates/a/src/waited.rs",
            "fn g(c: &Condvar, g: G) -> G { c.wait(g).unwrap_or_else(|e| e.into_inner()) }\n",
        ),
        file(
            "crates/candle/src/data_parallel.rs",
            "fn f(m: &Mutex<M>) -> Result<MutexGuard<'_, M>, E> { m.lock().map_err(|_| E) }\n",
        ),
        file(
            "crates/candle/src/replica.rs",
            "fn f(v: &VarMap) { let d = v.data().lock().unwrap_or_else(|e| e.into_inner()); }\n",
        ),
        file(
            "crates/pjrt/src/plugin.rs",
            "static L: Mutex<()> = Mutex::new(());\n",
        ),
    ];
    super::assert_violations(
        &poison_violations(&files),
        &[
            "crates/a/src/declared.rs: names `Mutex`; hold a `distribute_values::Lock`",
            "crates/a/src/unwrapped.rs: unwraps a lock's result;",
            "crates/a/src/recovered.rs: unwraps a lock's result, recovers a poisoned guard \
             (`|e| e.into_inner()`), names `PoisonError`;",
            "crates/a/src/waited.rs: recovers a poisoned guard (`|e| e.into_inner()`);",
            "crates/values/src/lock.rs: handles no poison any more (Lock itself)",
        ],
    );
}
