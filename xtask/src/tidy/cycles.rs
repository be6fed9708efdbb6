//! No circles between the files of a crate: for each workspace crate's `src/`, the graph with a
//! node per `.rs` file and an edge A → B where A's code (outside `#[cfg(test)]` items) names B's
//! module by a path (`crate::b::…`, `super::b::…`, `self::b`, `b::…` for a child `b`, a name
//! bound by `use`) or names an item that a module re-exports from B (`crate::A` with
//! `pub use b::A` in `lib.rs`). A module root (`lib.rs`, `main.rs`, a `mod.rs`, or any file with
//! child files) declares and re-exports: its `mod` and `use` lines are no edges, but its other
//! code is, through the names they bind. Every strongly connected component of more than one
//! file is a cycle, reported as one line.
//!
//! Lexical ([`super::source`]): `#[cfg]` alternatives (two `#[path]` files of one module) both
//! count, macro bodies are read as code (`$crate::x` is `crate::x`), and inside an inline
//! module `self` and `super` start from that module (`mod x86 { use super::f; }` is the file's
//! own `f`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::source::{Parsed, tokens};

/// The cycles between files that the tree had when this check came (issue 37), as [`cycles_in`]
/// writes them. They are being removed: the test fails when a cycle appears that is not here,
/// and when one here is gone (delete its line: the list only shrinks).
const CYCLES_TODAY: &[&str] = &[
    // Empty since issue 37: every crate's files form a DAG.
];

/// One file: a node of the graph.
struct File {
    /// Its path below `src/`, with `/`.
    rel: String,
    /// Its module path (`["group", "member"]`; the crate root's is empty).
    module: Vec<String>,
    parsed: Parsed,
}

/// One crate (a library or a binary root) as files and modules.
struct Crate {
    files: Vec<File>,
    /// The files of each module path: one, or two where `#[cfg]` picks a `#[path]` file.
    modules: BTreeMap<Vec<String>, Vec<usize>>,
}

/// Where a path leads.
enum Place {
    Module(Vec<String>),
    Files(Vec<usize>),
}

/// How deep names may lead through `use` bindings before resolution gives up.
const MAX_DEPTH: usize = 16;

impl Crate {
    /// The crate whose root file is `root`, its modules found by their `mod` declarations.
    fn load(src: &Path, root: &Path) -> Crate {
        let mut krate = Crate {
            files: Vec::new(),
            modules: BTreeMap::new(),
        };
        // (file, module path, the folder of its child files)
        let mut queue = vec![(
            root.to_path_buf(),
            Vec::new(),
            root.parent().unwrap().to_path_buf(),
        )];
        while let Some((path, module, dir)) = queue.pop() {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let parsed = Parsed::of(&tokens(&text));
            let file_dir = path.parent().unwrap().to_path_buf();
            for decl in parsed.mods.iter().filter(|m| !m.inline) {
                let child: Vec<String> =
                    module.iter().cloned().chain([decl.name.clone()]).collect();
                let (file, child_dir) = match &decl.path {
                    Some(attr) => (file_dir.join(attr), file_dir.clone()),
                    None if dir.join(format!("{}.rs", decl.name)).is_file() => {
                        (dir.join(format!("{}.rs", decl.name)), dir.join(&decl.name))
                    }
                    None => (dir.join(&decl.name).join("mod.rs"), dir.join(&decl.name)),
                };
                queue.push((file, child, child_dir));
            }
            let rel = path.strip_prefix(src).unwrap_or(&path);
            krate
                .modules
                .entry(module.clone())
                .or_default()
                .push(krate.files.len());
            krate.files.push(File {
                rel: rel.to_string_lossy().replace('\\', "/"),
                module,
                parsed,
            });
        }
        krate
    }

    fn files_of(&self, place: Option<Place>) -> Vec<usize> {
        match place {
            Some(Place::Module(module)) => self.modules.get(&module).cloned().unwrap_or_default(),
            Some(Place::Files(files)) => files,
            None => Vec::new(),
        }
    }

    /// Where `path`, written in file `from`, leads; `None` outside the crate.
    fn place(&self, from: usize, path: &[String], depth: usize) -> Option<Place> {
        let file = &self.files[from];
        let head = path.first()?.as_str();
        if depth > MAX_DEPTH {
            return None;
        }
        let (module, rest) = match head {
            "crate" | "$crate" => (Vec::new(), &path[1..]),
            "self" => (file.module.clone(), &path[1..]),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let mut module = file.module.clone();
                for _ in 0..ups {
                    module.pop()?;
                }
                (module, &path[ups..])
            }
            _ if file.parsed.mods.iter().any(|m| m.name == head && m.inline) => {
                return self.lookup(&file.module, path, depth + 1);
            }
            _ if file.parsed.mods.iter().any(|m| m.name == head) => {
                let child = file
                    .module
                    .iter()
                    .cloned()
                    .chain([head.to_owned()])
                    .collect();
                (child, &path[1..])
            }
            _ => return self.through(from, head, &path[1..], depth),
        };
        self.walk(module, rest, depth)
    }

    /// Where `rest` leads from `module`: down its child files as far as they go, then to the
    /// name that follows.
    fn walk(&self, mut module: Vec<String>, rest: &[String], depth: usize) -> Option<Place> {
        for (i, segment) in rest.iter().enumerate() {
            let child: Vec<String> = module.iter().cloned().chain([segment.clone()]).collect();
            if !self.modules.contains_key(&child) {
                return self.lookup(&module, &rest[i..], depth + 1);
            }
            module = child;
        }
        Some(Place::Module(module))
    }

    /// Where the name `rest[0]` of `module` leads: through an inline module, a `use` of the
    /// module's files (a re-export, or a glob whose module defines it), or a macro exported to
    /// the crate root; else to the module's own files, which define it.
    fn lookup(&self, module: &[String], rest: &[String], depth: usize) -> Option<Place> {
        let files = self.modules.get(module)?;
        let name = rest[0].as_str();
        if depth > MAX_DEPTH {
            return None;
        }
        for &f in files {
            let parsed = &self.files[f].parsed;
            if parsed.mods.iter().any(|m| m.inline && m.name == name) {
                return match rest.len() {
                    1 => Some(Place::Files(files.clone())),
                    _ => self.lookup(module, &rest[1..], depth + 1),
                };
            }
            if parsed.uses.iter().any(|u| u.name.as_deref() == Some(name)) {
                return self.through(f, name, &rest[1..], depth);
            }
        }
        for &f in files {
            for glob in self.files[f]
                .parsed
                .uses
                .iter()
                .filter(|u| u.name.is_none())
            {
                let Some(Place::Module(globbed)) = self.place(f, &glob.path, depth + 1) else {
                    continue;
                };
                let defines = |g: &usize| self.files[*g].parsed.defines.contains(name);
                if self
                    .modules
                    .get(&globbed)
                    .is_some_and(|g| g.iter().any(defines))
                {
                    return self.walk(globbed, rest, depth + 1);
                }
            }
        }
        if module.is_empty() {
            let exported: Vec<usize> = (0..self.files.len())
                .filter(|&f| {
                    self.files[f]
                        .parsed
                        .exported_macros
                        .iter()
                        .any(|m| m == name)
                })
                .collect();
            if !exported.is_empty() {
                return Some(Place::Files(exported));
            }
        }
        Some(Place::Files(files.clone()))
    }

    /// Where `rest` leads after the name `name` that file `from` binds with `use` (with two
    /// `#[cfg]` alternatives, both); `None` when it binds none or only names outside the crate.
    fn through(&self, from: usize, name: &str, rest: &[String], depth: usize) -> Option<Place> {
        let bindings = self.files[from].parsed.uses.iter();
        let mut places = bindings
            .filter(|u| u.name.as_deref() == Some(name))
            .filter_map(|u| {
                if u.path == [name] {
                    // `pub(crate) use m;` after `macro_rules! m`: the file's own macro, by path.
                    return Some(Place::Files(vec![from]));
                }
                let full: Vec<String> = u.path.iter().chain(rest).cloned().collect();
                self.place(from, &full, depth + 1)
            });
        let first = places.next()?;
        let more: Vec<Place> = places.collect();
        if more.is_empty() {
            return Some(first);
        }
        let all = std::iter::once(first).chain(more);
        Some(Place::Files(
            all.flat_map(|p| self.files_of(Some(p))).collect(),
        ))
    }

    /// The files each file's code names.
    fn edges(&self) -> Vec<BTreeSet<usize>> {
        (0..self.files.len())
            .map(|from| {
                let parsed = &self.files[from].parsed;
                let root = parsed.is_root() || self.files[from].module.is_empty();
                let uses = parsed.uses.iter().filter(|u| match &u.name {
                    // A root's `use` binds a name: an edge only where its code says the name.
                    Some(name) if root => parsed.idents.contains(name),
                    None if root => false,
                    _ => true,
                });
                let paths = uses.map(|u| &u.path).chain(&parsed.paths);
                let mut to = BTreeSet::new();
                for path in paths {
                    to.extend(self.files_of(self.place(from, path, 0)));
                }
                to.remove(&from);
                to
            })
            .collect()
    }
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn components(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct Tarjan<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in self.edges[v].iter() {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let n = edges.len();
    let mut tarjan = Tarjan {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if tarjan.index[v].is_none() {
            tarjan.visit(v);
        }
    }
    tarjan.found
}

/// A cycle through every file of `component` (named by `names`), the first in name order from
/// its first name, if there is one.
fn tour(component: &[usize], names: &[String], edges: &[BTreeSet<usize>]) -> Option<Vec<usize>> {
    fn extend(
        path: &mut Vec<usize>,
        left: &mut BTreeSet<usize>,
        edges: &[BTreeSet<usize>],
        order: &dyn Fn(&usize) -> String,
        budget: &mut usize,
    ) -> bool {
        let last = *path.last().unwrap();
        if left.is_empty() {
            return edges[last].contains(&path[0]);
        }
        let mut next: Vec<usize> = edges[last].intersection(left).copied().collect();
        next.sort_by_key(order);
        for n in next {
            *budget = budget.checked_sub(1).unwrap_or_default();
            if *budget == 0 {
                return false;
            }
            left.remove(&n);
            path.push(n);
            if extend(path, left, edges, order, budget) {
                return true;
            }
            path.pop();
            left.insert(n);
        }
        false
    }
    let order = |f: &usize| names[*f].clone();
    let first = *component.iter().min_by_key(|f| order(f))?;
    let mut left: BTreeSet<usize> = component.iter().copied().filter(|&f| f != first).collect();
    let mut path = vec![first];
    let mut budget = 100_000;
    extend(&mut path, &mut left, edges, &order, &mut budget).then_some(path)
}

/// Every cycle between the files of the crate sources in `src` (its `lib.rs`, `main.rs` and
/// `bin/*.rs` roots), one line each, shown below `shown` (`crates/input/src`): `a.rs → b.rs →
/// a.rs`, or where no cycle passes every file once, the files and that each reaches the others.
pub(super) fn cycles_in(src: &Path, shown: &str) -> Vec<String> {
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"].iter().map(|r| src.join(r)).collect();
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = bins.flatten().map(|e| e.path()).collect();
        bins.sort();
        roots.extend(
            bins.into_iter()
                .map(|b| if b.is_dir() { b.join("main.rs") } else { b }),
        );
    }
    let mut lines = Vec::new();
    for root in roots.iter().filter(|r| r.is_file()) {
        let krate = Crate::load(src, root);
        let edges = krate.edges();
        let names: Vec<String> = krate.files.iter().map(|f| f.rel.clone()).collect();
        let mut found: Vec<String> = components(&edges)
            .iter()
            .map(|component| match tour(component, &names, &edges) {
                Some(tour) => {
                    let files: Vec<&str> = tour
                        .iter()
                        .chain(&tour[..1])
                        .map(|&f| names[f].as_str())
                        .collect();
                    format!("{shown}: {}", files.join(" → "))
                }
                None => {
                    let mut files: Vec<&str> =
                        component.iter().map(|&f| names[f].as_str()).collect();
                    files.sort_unstable();
                    format!("{shown}: {} (each reaches every other)", files.join(", "))
                }
            })
            .collect();
        found.sort();
        lines.extend(found);
    }
    lines
}

#[test]
fn the_files_of_each_crate_form_no_cycle_but_todays() {
    let root = super::workspace_root();
    let mut found = Vec::new();
    for package in super::workspace_packages() {
        let src = package.manifest.parent().unwrap().join("src");
        let shown = src
            .strip_prefix(&root)
            .unwrap_or(&src)
            .to_string_lossy()
            .into_owned();
        found.extend(cycles_in(&src, &shown));
    }
    let mut violations: Vec<String> = found
        .iter()
        .filter(|line| !CYCLES_TODAY.contains(&line.as_str()))
        .map(|line| format!("a new cycle between files: {line}"))
        .collect();
    violations.extend(
        CYCLES_TODAY
            .iter()
            .filter(|line| !found.iter().any(|f| f == *line))
            .map(|line| format!("gone (remove it from CYCLES_TODAY): {line}")),
    );
    assert!(
        violations.is_empty(),
        "{}\n\nfound today:\n{}",
        violations.join("\n"),
        found.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cycles of a crate made of `files` (path below `src/`, text).
    fn cycles(files: &[(&str, &str)]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        for (path, text) in files {
            let path = src.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        cycles_in(&src, "c/src")
    }

    #[test]
    fn two_files_that_name_each_other_are_a_cycle() {
        let found = cycles(&[
            (
                "lib.rs",
                "//! c\nmod batch;\nmod rows;\npub use batch::Batch;\n",
            ),
            (
                "batch.rs",
                "use crate::rows::Rows;\npub struct Batch(Rows);\n",
            ),
            (
                "rows.rs",
                "pub struct Rows;\nfn f() { super::batch::Batch::new(); }\n",
            ),
        ]);
        super::super::assert_violations(&found, &["c/src: batch.rs → rows.rs → batch.rs"]);
    }

    #[test]
    fn a_three_file_cycle_is_one_line_in_name_order() {
        let found = cycles(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::c::C;\npub struct A;\n"),
            ("b.rs", "use crate::{a::A};\npub struct B;\n"),
            ("c.rs", "pub struct C(crate::b::B);\n"),
        ]);
        super::super::assert_violations(&found, &["c/src: a.rs → c.rs → b.rs → a.rs"]);
    }

    #[test]
    fn a_name_the_root_re_exports_leads_to_the_file_that_defines_it() {
        let found = cycles(&[
            ("lib.rs", "mod group;\nmod ops;\npub use ops::Ops;\n"),
            (
                "group/mod.rs",
                "mod member;\npub(crate) use member::{Member, Plan};\n",
            ),
            (
                "group/member.rs",
                "pub struct Member(crate::Ops);\npub struct Plan;\n",
            ),
            (
                "ops.rs",
                "pub struct Ops;\nfn f(m: &crate::group::Member) {}\n",
            ),
        ]);
        super::super::assert_violations(
            &found,
            &["c/src: group/member.rs → ops.rs → group/member.rs"],
        );
    }

    #[test]
    fn super_and_self_name_modules() {
        let found = cycles(&[
            ("lib.rs", "mod cuda;\n"),
            (
                "cuda/mod.rs",
                "mod device;\nmod memory;\nfn f() { self::memory::alloc(); }\n",
            ),
            ("cuda/device.rs", "pub struct Device;\n"),
            (
                "cuda/memory.rs",
                "pub fn alloc() { super::f(); let d: super::device::Device; }\n",
            ),
        ]);
        super::super::assert_violations(
            &found,
            &["c/src: cuda/memory.rs → cuda/mod.rs → cuda/memory.rs"],
        );
    }

    #[test]
    fn super_in_an_inline_module_is_the_file_itself() {
        // `kernels.rs`'s `mod simd { use super::gradients; }` names kernels' own function, not
        // `model.rs`'s.
        let found = cycles(&[
            ("lib.rs", "mod model;\n"),
            (
                "model.rs",
                "mod kernels;\npub fn gradients() {}\nfn f() { kernels::run(); }\n",
            ),
            (
                "model/kernels.rs",
                "pub fn run() { simd::fast(); }\nfn gradients() {}\n\
                 mod simd {\n    use super::gradients;\n    pub fn fast() { gradients(); }\n}\n",
            ),
        ]);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn test_modules_and_comments_are_no_edges() {
        let found = cycles(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub fn a() { crate::b::b(); }\n"),
            (
                "b.rs",
                "/// Unlike [`crate::a::a`].\npub fn b() {}\n\
                 #[cfg(test)]\nmod tests {\n    use crate::a::a;\n}\n",
            ),
        ]);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_roots_re_exports_and_declarations_are_no_edges() {
        // The root re-exports what its children define and the children use each other through
        // it: no cycle, as long as the root's own code names none of them.
        let found = cycles(&[
            (
                "lib.rs",
                "mod a;\nmod b;\npub use a::A;\npub use b::B;\nuse b::hidden as gpu;\n",
            ),
            (
                "a.rs",
                "pub struct A(crate::B);\nfn f() { crate::gpu::go(); }\n",
            ),
            ("b.rs", "pub struct B;\npub fn hidden() {}\n"),
        ]);
        assert_eq!(found, Vec::<String>::new());
        // Once the root's code uses a child that uses the root, they are a cycle.
        let found = cycles(&[
            (
                "lib.rs",
                "mod a;\npub use a::A;\npub struct Config;\nfn f(a: A) {}\n",
            ),
            ("a.rs", "pub struct A(crate::Config);\n"),
        ]);
        super::super::assert_violations(&found, &["c/src: a.rs → lib.rs → a.rs"]);
    }
}
