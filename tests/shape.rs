//! The code's shape, measured on the sources (non-test code only: `tests/`,
//! `benches/` and `#[cfg(test)]` items are left out):
//!
//! - lines per crate, and the engine's share of the project's Rust;
//! - functions over 100 lines and files over 1,000 lines in the crates of
//!   `HELD` (every crate but the ledger);
//! - module cycles among the engine's top-level modules, other than through
//!   its error enum (`error.rs`, which names every module's error type);
//! - imports a crate must never make (ARCHITECTURE.md, "What each crate must
//!   never import").
//!
//! Each limit has a list of today's known exceptions. An exception not on
//! its list fails, and so does an entry on a list that no longer needs to be
//! there, so the lists only shrink. Print the measurements with
//! `cargo test --test shape -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// Functions allowed over 100 lines today, as `crate::path::fn`.
const LONG_FUNCTIONS: &[&str] = &[];
/// Files allowed over 1,000 non-test lines today.
const LONG_FILES: &[&str] = &[];
/// Module cycles allowed today, each as its sorted modules joined by `,`.
const CYCLES: &[&str] = &[];
/// The engine's share of the project's non-test Rust may not exceed this.
const ENGINE_SHARE: f64 = 0.40;
/// Crates whose functions and files are held to the limits (`mass` is the
/// binary's `src/`). Not yet `ledger`: `store.rs` and `index.rs` are over
/// 1,000 non-test lines.
const HELD: &[&str] = &[
    "engine",
    "proxy",
    "audit",
    "workers",
    "tables",
    "import",
    "sandbox",
    "replay",
    "remote",
    "supervise",
    "schemas",
    "rank",
    "mass",
];

/// What a crate (or a module of one, `crate::module`) must never import:
/// (importer, forbidden path prefix, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    ("ledger", "schemas", "the ledger stores opaque bytes"),
    ("ledger", "replay", "the ledger knows nothing of effects"),
    ("ledger", "tokio", "the ledger is synchronous"),
    ("replay", "engine", "replay knows nothing of MASS"),
    ("rank", "ledger", "ranking is pure statistics"),
    ("sandbox", "ledger", "confinement records nothing"),
    (
        "supervise",
        "ledger",
        "supervision knows processes, records nothing",
    ),
    (
        "supervise",
        "engine",
        "supervision knows processes, not MASS",
    ),
    ("proxy", "engine", "the proxy serves any OpenAI client"),
    ("proxy", "sandbox", "the proxy confines nothing"),
    (
        "remote",
        "engine",
        "remotes move objects, whatever records they hold",
    ),
    (
        "remote",
        "schemas",
        "remotes move objects, whatever records they hold",
    ),
    (
        "remote",
        "replay",
        "remotes move objects, whatever records they hold",
    ),
    (
        "audit",
        "engine::cycle",
        "the audit reads runs, never drives them",
    ),
    (
        "audit",
        "engine::driver",
        "the audit reads runs, never drives them",
    ),
    (
        "audit",
        "engine::stages",
        "the audit reads runs, never drives them",
    ),
    (
        "audit",
        "engine::exec",
        "the audit reads runs, never drives them",
    ),
    (
        "audit",
        "engine::harness",
        "the audit reads runs, never drives them",
    ),
    (
        "audit",
        "engine::backend",
        "the audit reads runs, never calls models",
    ),
    (
        "audit",
        "engine::work",
        "the audit reads runs, never executes work",
    ),
    (
        "audit",
        "engine::tools",
        "the audit reads runs, never runs tools",
    ),
    ("audit", "sandbox", "the audit runs nothing"),
    (
        "tables",
        "engine::cycle",
        "the tables read runs, never drive them",
    ),
    (
        "tables",
        "engine::stages",
        "the tables read runs, never drive them",
    ),
    (
        "tables",
        "engine::backend",
        "the tables read runs, never call models",
    ),
    ("tables", "sandbox", "the tables run nothing"),
    (
        "import",
        "engine",
        "an import writes records of a run made elsewhere; it drives nothing",
    ),
    ("import", "sandbox", "an import runs nothing"),
    (
        "workers",
        "engine::cycle",
        "a worker executes items, it never drives the loops",
    ),
    (
        "workers",
        "engine::driver",
        "a worker executes items, it never drives the loops",
    ),
    (
        "workers",
        "engine::stages",
        "a worker executes items, it never drives the loops",
    ),
    (
        "workers",
        "engine::context",
        "a worker executes items, it never drives the loops",
    ),
    (
        "engine",
        "workers",
        "the engine submits to an executor; where it runs is the caller's choice",
    ),
    (
        "remote",
        "workers",
        "remotes move objects, whatever records they hold",
    ),
    // Inside the engine: executing a work item (a rollout, a judgment)
    // needs nothing from the loops that hand them out.
    (
        "engine::harness",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::harness",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::harness",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::harness",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::tools",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::tools",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::tools",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::tools",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::checks",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::checks",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::checks",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::checks",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::guards",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::guards",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::guards",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::guards",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::effects",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::effects",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::effects",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::effects",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::judge",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::judge",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::judge",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::judge",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::optimizer",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::optimizer",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::optimizer",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::optimizer",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::work",
        "engine::cycle",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::work",
        "engine::driver",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::work",
        "engine::stages",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::work",
        "engine::context",
        "executing work needs nothing from the loops",
    ),
    (
        "engine::status",
        "engine::stages",
        "the read side names no loop",
    ),
    (
        "engine::transcript",
        "engine::stages",
        "the read side names no loop",
    ),
    (
        "engine::milestone",
        "engine::stages",
        "the read side names no loop",
    ),
];

const CRATES: &[(&str, &str)] = &[
    ("ledger", "ledger/src"),
    ("schemas", "schemas/src"),
    ("rank", "rank/src"),
    ("replay", "replay/src"),
    ("sandbox", "sandbox/src"),
    ("supervise", "supervise/src"),
    ("proxy", "proxy/src"),
    ("remote", "remote/src"),
    ("workers", "workers/src"),
    ("engine", "engine/src"),
    ("audit", "audit/src"),
    ("tables", "tables/src"),
    ("import", "import/src"),
    ("mass", "src"),
];

/// The checkout measured: this one, or the one `MASS_SHAPE_ROOT` names (to
/// print an older checkout's figures beside today's; its exceptions will
/// differ, so the test fails there after printing them).
fn root() -> PathBuf {
    std::env::var_os("MASS_SHAPE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(l) if l.path.is_ident("cfg") => {
            let s = l.tokens.to_string();
            s.contains("test") && !s.contains("not")
        }
        _ => false,
    })
}

/// One source file, parsed.
struct Source {
    krate: &'static str,
    /// The module path inside the crate (`["backend", "sim"]`).
    module: Vec<String>,
    rel: String,
    lines: usize,
    test_lines: usize,
    file: syn::File,
}

fn module_of(src_dir: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src_dir).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn sources() -> Vec<Source> {
    let mut out = Vec::new();
    for (krate, dir) in CRATES {
        let dir = root().join(dir);
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let test_lines: usize = file
                .items
                .iter()
                .filter(|i| is_cfg_test(item_attrs(i)))
                .map(|i| i.span().end().line + 1 - i.span().start().line)
                .sum();
            out.push(Source {
                krate,
                module: module_of(&dir, &path),
                rel: path.strip_prefix(root()).unwrap().display().to_string(),
                lines: text.lines().count(),
                test_lines,
                file,
            });
        }
    }
    out
}

fn item_attrs(i: &syn::Item) -> &[syn::Attribute] {
    match i {
        syn::Item::Mod(m) => &m.attrs,
        syn::Item::Fn(f) => &f.attrs,
        syn::Item::Impl(x) => &x.attrs,
        syn::Item::Use(u) => &u.attrs,
        syn::Item::Struct(s) => &s.attrs,
        syn::Item::Enum(e) => &e.attrs,
        syn::Item::Const(c) => &c.attrs,
        syn::Item::Static(s) => &s.attrs,
        syn::Item::Trait(t) => &t.attrs,
        _ => &[],
    }
}

/// Functions (free, inherent, trait) with their line counts, signature to
/// closing brace, outside `#[cfg(test)]` items.
#[derive(Default)]
struct Functions {
    prefix: String,
    found: Vec<(String, usize)>,
}

impl Functions {
    fn add(&mut self, name: &syn::Ident, start: proc_macro2::Span, block: &syn::Block) {
        let lines = block.brace_token.span.close().end().line + 1 - start.start().line;
        self.found
            .push((format!("{}::{}", self.prefix, name), lines));
    }
}

impl<'a> Visit<'a> for Functions {
    fn visit_item(&mut self, i: &'a syn::Item) {
        if !is_cfg_test(item_attrs(i)) {
            syn::visit::visit_item(self, i);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        self.add(&f.sig.ident, f.sig.fn_token.span, &f.block);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.add(&f.sig.ident, f.sig.fn_token.span, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(b) = &f.default {
            self.add(&f.sig.ident, f.sig.fn_token.span, b);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// The paths a file names: `use` trees and paths in code, resolved against
/// the file's module (`crate::`, `super::`, `self::`), outside test items.
struct Paths<'m> {
    krate: &'m str,
    module: &'m [String],
    found: BTreeSet<String>,
}

impl Paths<'_> {
    fn resolve(&self, segs: &[String]) -> Option<String> {
        let mut i = 0;
        let mut base: Vec<String>;
        match segs.first().map(String::as_str) {
            Some("crate") => {
                base = vec![self.krate.to_string()];
                i = 1;
            }
            Some("super" | "self") => {
                base = std::iter::once(self.krate.to_string())
                    .chain(self.module.iter().cloned())
                    .collect();
                while segs.get(i).map(String::as_str) == Some("super") {
                    base.pop();
                    i += 1;
                }
                if segs.get(i).map(String::as_str) == Some("self") {
                    i += 1;
                }
            }
            Some(_) => base = Vec::new(),
            None => return None,
        }
        base.extend(segs[i..].iter().cloned());
        Some(base.join("::"))
    }
    fn walk_use(&mut self, prefix: &mut Vec<String>, t: &syn::UseTree) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.walk_use(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.add_use(prefix, &n.ident.to_string()),
            syn::UseTree::Rename(r) => self.add_use(prefix, &r.ident.to_string()),
            syn::UseTree::Glob(_) => self.add_use(prefix, "*"),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.walk_use(prefix, t)),
        }
    }
    fn add_use(&mut self, prefix: &[String], last: &str) {
        let mut segs = prefix.to_vec();
        if last != "self" && last != "*" {
            segs.push(last.to_string());
        }
        if let Some(p) = self.resolve(&segs) {
            self.found.insert(p);
        }
    }
}

impl<'a> Visit<'a> for Paths<'_> {
    fn visit_item(&mut self, i: &'a syn::Item) {
        if !is_cfg_test(item_attrs(i)) {
            syn::visit::visit_item(self, i);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        self.walk_use(&mut Vec::new(), &u.tree);
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 {
            if let Some(r) = self.resolve(&segs) {
                self.found.insert(r);
            }
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        // Paths inside macro calls (`format!`, `matches!`) are parsed as
        // expressions where they can be.
        if let Ok(args) = m.parse_body_with(
            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
        ) {
            args.iter().for_each(|e| self.visit_expr(e));
        }
        syn::visit::visit_macro(self, m);
    }
}

fn paths_of(s: &Source) -> BTreeSet<String> {
    let mut v = Paths {
        krate: s.krate,
        module: &s.module,
        found: BTreeSet::new(),
    };
    v.visit_file(&s.file);
    v.found
}

/// Strongly connected components of more than one node (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'e> {
        edges: &'e BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        out: Vec<Vec<String>>,
    }
    fn go(t: &mut T, v: &str) {
        let n = t.index.len();
        t.index.insert(v.into(), n);
        t.low.insert(v.into(), n);
        t.stack.push(v.into());
        t.on.insert(v.into());
        for w in t.edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                go(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(&w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            go(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

/// The engine's top-level modules and who names whom, without `error`.
fn engine_graph(all: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let engine: Vec<&Source> = all.iter().filter(|s| s.krate == "engine").collect();
    let modules: BTreeSet<&String> = engine.iter().filter_map(|s| s.module.first()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &engine {
        let Some(from) = s.module.first().filter(|m| *m != "error") else {
            continue;
        };
        let e = edges.entry(from.clone()).or_default();
        for p in paths_of(s) {
            let mut it = p.split("::");
            if it.next() != Some("engine") {
                continue;
            }
            if let Some(to) = it.next().map(str::to_string) {
                if to != *from && to != "error" && modules.contains(&to) {
                    e.insert(to);
                }
            }
        }
    }
    edges
}

fn check_list(what: &str, found: &BTreeSet<String>, allowed: &[&str]) -> Vec<String> {
    let allowed: BTreeSet<String> = allowed.iter().map(|s| s.to_string()).collect();
    let mut bad = Vec::new();
    for f in found.difference(&allowed) {
        bad.push(format!("{what}: {f} (new; split it)"));
    }
    for a in allowed.difference(found) {
        bad.push(format!(
            "{what}: {a} is listed as an exception but no longer is one: take it off the list"
        ));
    }
    bad
}

#[test]
fn the_code_keeps_its_shape() {
    let all = sources();
    let mut problems = Vec::new();

    // Lines per crate.
    let mut per_crate: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &all {
        *per_crate.entry(s.krate).or_default() += s.lines - s.test_lines;
    }
    let total: usize = per_crate.values().sum();
    println!("non-test lines per crate (total {total}):");
    for (k, n) in &per_crate {
        println!(
            "  {k:<8} {n:>6}  {:>5.1}%",
            100.0 * *n as f64 / total as f64
        );
    }
    let share = per_crate["engine"] as f64 / total as f64;
    if share > ENGINE_SHARE {
        problems.push(format!(
            "the engine holds {:.1}% of the project's non-test Rust (limit {:.0}%)",
            100.0 * share,
            100.0 * ENGINE_SHARE
        ));
    }

    // Functions and files.
    let mut fns: Vec<(String, usize)> = Vec::new();
    let mut long_files = BTreeSet::new();
    for s in all.iter().filter(|s| HELD.contains(&s.krate)) {
        let mut v = Functions {
            prefix: std::iter::once(s.krate.to_string())
                .chain(s.module.iter().cloned())
                .collect::<Vec<_>>()
                .join("::"),
            ..Default::default()
        };
        v.visit_file(&s.file);
        fns.extend(v.found);
        if s.lines - s.test_lines > 1000 {
            long_files.insert(s.rel.clone());
        }
    }
    fns.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    println!("the ten longest functions (held crates):");
    for (name, n) in fns.iter().take(10) {
        println!("  {n:>4}  {name}");
    }
    let long: BTreeSet<String> = fns
        .iter()
        .filter(|f| f.1 > 100)
        .map(|f| f.0.clone())
        .collect();
    problems.extend(check_list("function over 100 lines", &long, LONG_FUNCTIONS));
    println!("files over 1,000 non-test lines: {long_files:?}");
    problems.extend(check_list(
        "file over 1,000 non-test lines",
        &long_files,
        LONG_FILES,
    ));

    // Module cycles.
    let found: BTreeSet<String> = cycles(&engine_graph(&all))
        .into_iter()
        .map(|c| c.join(","))
        .collect();
    println!("engine module cycles (not through error): {found:?}");
    problems.extend(check_list("engine module cycle", &found, CYCLES));

    // Forbidden imports.
    for s in &all {
        for p in paths_of(s) {
            for (k, prefix, why) in FORBIDDEN {
                let here = std::iter::once(s.krate.to_string())
                    .chain(s.module.iter().cloned())
                    .collect::<Vec<_>>()
                    .join("::");
                let inside = here == *k || here.starts_with(&format!("{k}::"));
                if inside && (p == *prefix || p.starts_with(&format!("{prefix}::"))) {
                    problems.push(format!(
                        "{} names {p}: {k} must never import {prefix} ({why})",
                        s.rel
                    ));
                }
            }
        }
    }

    assert!(
        problems.is_empty(),
        "the code lost its shape:\n  {}",
        problems.join("\n  ")
    );
}
