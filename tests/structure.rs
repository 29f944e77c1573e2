//! The house's structure, checked on the sources: no import circles
//! between the rooms of a crate, and no file in `src/transport` over 800
//! lines.
//!
//! A room is a source file. Room A depends on room B when A's code (its
//! `use` statements and the paths it names, test modules aside) reaches an
//! item defined in B; re-exports (`pub use`) are seen through to where the
//! item is defined. A module and the modules nested in it are one house
//! of their own: the front (`mod.rs`) and its parts may refer to each
//! other, as a type's methods split over files do; every other pair of
//! rooms must depend one way at most, through any chain. A new circle
//! fails here, naming its rooms and what each takes from the next.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The library and binary crates whose rooms are checked.
const CRATES: &[&str] = &[
    "src",
    "uring/src",
    "shm/src",
    "gpu/src",
    "gpu/nccl-standin/src",
    "benches/src",
    "adapters/candle/src",
];

/// Longest file allowed under `src/transport`.
const TRANSPORT_MAX_LINES: usize = 800;

type ModPath = Vec<String>;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file holds: `a/b.rs` and `a/b/mod.rs` are `a::b`, the
/// crate root (`lib.rs`, `main.rs`) is empty.
fn module_of(root: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(root).expect("under the crate root");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    } else if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Test-only files: `tests.rs` and anything in a `tests` folder.
fn is_test_file(root: &Path, file: &Path) -> bool {
    let rel = file.strip_prefix(root).expect("under the crate root");
    rel.file_name().is_some_and(|n| n == "tests.rs")
        || rel.components().any(|c| c.as_os_str() == "tests")
}

/// The text with comments, string and character literals blanked out.
fn strip_comments_and_strings(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// Removes every `#[cfg(test)] mod name { ... }` block.
fn strip_test_modules(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(at) = out.find("#[cfg(test)]") {
        let after = out[at + "#[cfg(test)]".len()..].trim_start();
        if !after.starts_with("mod ") {
            // Some other test-only item: drop the attribute's item line.
            let end = out[at..].find('\n').map_or(out.len(), |n| at + n);
            out.replace_range(at..end, "");
            continue;
        }
        let open = match out[at..].find(['{', ';']) {
            Some(n) => at + n,
            None => break,
        };
        if out.as_bytes()[open] == b';' {
            out.replace_range(at..=open, "");
            continue;
        }
        let mut depth = 0;
        let mut end = out.len();
        for (k, ch) in out[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.replace_range(at..end, "");
    }
    out
}

/// `internal_use!(tree);` (ringwire's macro: public under `internals`)
/// written as the re-export it is, `pub use tree;`.
fn internal_uses_as_reexports(code: &str) -> String {
    const MACRO: &str = "internal_use!(";
    let mut out = code.to_string();
    while let Some(at) = out.find(MACRO) {
        let open = at + MACRO.len() - 1;
        let mut depth = 0;
        let mut close = out.len() - 1;
        for (k, ch) in out[open..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let tree = out[open + 1..close].to_string();
        out.replace_range(at..=close, &format!("pub use {tree}"));
    }
    out
}

/// One `use` statement: whether it is a re-export, and its tree.
struct Use {
    reexport: bool,
    tree: String,
}

/// The `use` statements of `code`, and the code without them (and without
/// `pub(in path)` visibilities, which name modules but use nothing).
fn split_uses(code: &str) -> (Vec<Use>, String) {
    let mut uses = Vec::new();
    let mut rest = String::with_capacity(code.len());
    let bytes = code.as_bytes();
    let mut i = 0;
    let mut last = 0;
    while let Some(found) = code[i..].find("use") {
        let at = i + found;
        let before_ok = at == 0 || !is_ident_byte(bytes[at - 1]);
        let after_ok = bytes.get(at + 3).is_some_and(|b| b.is_ascii_whitespace());
        if !(before_ok && after_ok) {
            i = at + 3;
            continue;
        }
        let Some(semi) = code[at..].find(';').map(|n| at + n) else {
            break;
        };
        let head = code[last..at].trim_end();
        let reexport = head.ends_with("pub")
            || (head.ends_with(')')
                && head
                    .rfind("pub(")
                    .is_some_and(|p| !head[p..].contains('\n')));
        uses.push(Use {
            reexport,
            tree: code[at + 3..semi].trim().to_string(),
        });
        rest.push_str(&code[last..at]);
        last = semi + 1;
        i = semi + 1;
    }
    rest.push_str(&code[last..]);
    while let Some(at) = rest.find("pub(in ") {
        let end = rest[at..].find(')').map_or(rest.len(), |n| at + n + 1);
        rest.replace_range(at..end, "pub");
    }
    (uses, rest)
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The paths a use tree names, each with the name it binds.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<(Vec<String>, String)>) {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for ch in tree.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    for part in parts {
        let part: String = part.split_whitespace().collect::<Vec<_>>().join(" ");
        if part.is_empty() {
            continue;
        }
        if let Some(open) = part.find('{') {
            let close = part.rfind('}').expect("a use group closes");
            let mut inner_prefix = prefix.to_vec();
            inner_prefix.extend(segments(part[..open].trim_end_matches("::")));
            expand(&inner_prefix, &part[open + 1..close], out);
            continue;
        }
        let (path, alias) = match part.split_once(" as ") {
            Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
            None => (part.as_str(), None),
        };
        let mut segs = prefix.to_vec();
        segs.extend(segments(path));
        let name = alias.unwrap_or_else(|| segs.last().cloned().unwrap_or_default());
        out.push((segs, name));
    }
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Every `a::b::c` path named in `code`.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts =
            is_ident_byte(b[i]) && (i == 0 || (!is_ident_byte(b[i - 1]) && b[i - 1] != b':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < b.len() && is_ident_byte(b[j]) {
                j += 1;
            }
            segs.push(code[s..j].to_string());
            if b.get(j) == Some(&b':')
                && b.get(j + 1) == Some(&b':')
                && b.get(j + 2).is_some_and(|c| is_ident_byte(*c))
            {
                j += 2;
            } else {
                break;
            }
        }
        if segs.len() > 1 {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

struct Crate {
    /// Module path to file.
    files: BTreeMap<ModPath, PathBuf>,
    /// Re-exports: (module, name) to the path it stands for.
    reexports: HashMap<(ModPath, String), Vec<String>>,
    /// Per file: the absolute paths its code uses, with the local names
    /// its `use` statements bind.
    uses: BTreeMap<PathBuf, Vec<Vec<String>>>,
}

impl Crate {
    fn read(root: &Path) -> Crate {
        let mut paths = Vec::new();
        rust_files(root, &mut paths);
        let files: BTreeMap<ModPath, PathBuf> = paths
            .iter()
            .map(|p| (module_of(root, p), p.clone()))
            .collect();
        let mut reexports = HashMap::new();
        let mut uses = BTreeMap::new();
        for path in &paths {
            let me = module_of(root, path);
            let text = std::fs::read_to_string(path).expect("a readable source file");
            let code =
                internal_uses_as_reexports(&strip_test_modules(&strip_comments_and_strings(&text)));
            let (statements, rest) = split_uses(&code);
            let mut locals: HashMap<String, Vec<String>> = HashMap::new();
            let mut used = Vec::new();
            for statement in &statements {
                let mut named = Vec::new();
                expand(&[], &statement.tree, &mut named);
                for (segs, name) in named {
                    let Some(abs) = absolute(&files, &me, &segs, &HashMap::new()) else {
                        continue;
                    };
                    let abs = if segs.last().is_some_and(|s| s == "self") {
                        abs[..abs.len() - 1].to_vec()
                    } else {
                        abs
                    };
                    let name = if name == "self" {
                        abs.last().cloned().unwrap_or_default()
                    } else {
                        name
                    };
                    if statement.reexport && name != "*" {
                        reexports.insert((me.clone(), name.clone()), abs.clone());
                    }
                    if name != "*" {
                        locals.insert(name, abs.clone());
                    }
                    if !statement.reexport {
                        used.push(abs);
                    }
                }
            }
            for segs in inline_paths(&rest) {
                if let Some(abs) = absolute(&files, &me, &segs, &locals) {
                    used.push(abs);
                }
            }
            if !is_test_file(root, path) {
                uses.insert(path.clone(), used);
            }
        }
        Crate {
            files,
            reexports,
            uses,
        }
    }

    /// The file that defines what `path` names, seeing through re-exports.
    fn defining_file(&self, path: &[String], depth: usize) -> Option<&PathBuf> {
        if depth > 16 {
            return None;
        }
        for k in (0..=path.len()).rev() {
            let module = &path[..k];
            if let Some(file) = self.files.get(module) {
                if k < path.len()
                    && let Some(target) = self.reexports.get(&(module.to_vec(), path[k].clone()))
                {
                    let mut through = target.clone();
                    through.extend_from_slice(&path[k + 1..]);
                    return self.defining_file(&through, depth + 1).or(Some(file));
                }
                return Some(file);
            }
        }
        None
    }
}

/// `segs` as a path from the crate root, where it starts at `crate`,
/// `self`, `super`, a child module of `me`, or a name `me` imported.
fn absolute(
    files: &BTreeMap<ModPath, PathBuf>,
    me: &ModPath,
    segs: &[String],
    locals: &HashMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    let first = segs.first()?;
    if first == "crate" {
        return Some(segs[1..].to_vec());
    }
    if first == "self" || first == "super" {
        let mut base = me.clone();
        let mut rest = segs;
        while let Some(s) = rest.first() {
            match s.as_str() {
                "super" => {
                    base.pop();
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
        base.extend_from_slice(rest);
        return Some(base);
    }
    let mut child = me.clone();
    child.push(first.clone());
    if files.contains_key(&child) {
        let mut abs = me.clone();
        abs.extend_from_slice(segs);
        return Some(abs);
    }
    let local = locals.get(first)?;
    let mut abs = local.clone();
    abs.extend_from_slice(&segs[1..]);
    Some(abs)
}

fn is_nested(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The import circles of the crate at `root`, each described.
fn circles(root: &Path) -> Vec<String> {
    let krate = Crate::read(root);
    let module = |file: &PathBuf| module_of(root, file);
    let mut edges: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> = BTreeMap::new();
    for (file, used) in &krate.uses {
        let entry = edges.entry(file.clone()).or_default();
        for path in used {
            let Some(target) = krate.defining_file(path, 0) else {
                continue;
            };
            if target == file || !krate.uses.contains_key(target) {
                continue;
            }
            if is_nested(&module(file), &module(target)) {
                continue;
            }
            entry
                .entry(target.clone())
                .or_default()
                .insert(path.join("::"));
        }
    }
    // Tarjan's strongly connected components.
    let nodes: Vec<PathBuf> = edges.keys().cloned().collect();
    let index_of: HashMap<&PathBuf, usize> =
        nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let adjacency: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            edges[n]
                .keys()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let mut state = Tarjan {
        adjacency: &adjacency,
        index: vec![None; nodes.len()],
        low: vec![0; nodes.len()],
        on_stack: vec![false; nodes.len()],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..nodes.len() {
        if state.index[v].is_none() {
            state.visit(v);
        }
    }
    let rel = |p: &PathBuf| p.strip_prefix(repo()).unwrap_or(p).display().to_string();
    state
        .components
        .iter()
        .filter(|c| c.len() > 1)
        .map(|component| {
            let mut text = format!(
                "a circle of {} rooms: {}",
                component.len(),
                component
                    .iter()
                    .map(|&v| rel(&nodes[v]))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for &v in component {
                for (target, items) in &edges[&nodes[v]] {
                    if component.iter().any(|&w| &nodes[w] == target) {
                        let items: Vec<&str> = items.iter().map(String::as_str).take(6).collect();
                        text.push_str(&format!(
                            "\n    {} -> {} ({})",
                            rel(&nodes[v]),
                            rel(target),
                            items.join(", ")
                        ));
                    }
                }
            }
            text
        })
        .collect()
}

struct Tarjan<'a> {
    adjacency: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.adjacency[v] {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
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
            self.components.push(component);
        }
    }
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    for dir in CRATES {
        let root = repo().join(dir);
        assert!(root.is_dir(), "{} is missing", root.display());
        found.extend(circles(&root));
    }
    assert!(
        found.is_empty(),
        "import circles (move what two rooms share below both, or merge rooms that are one \
         concern):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_circle_is_seen() {
    // The checker itself: two sibling rooms that use each other, and a
    // re-export that hides where an item lives, are found.
    let dir = std::env::temp_dir().join(format!("ringwire-structure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("room")).expect("a temporary folder");
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("a file");
    write("lib.rs", "mod a;\nmod room;\npub use room::b::B;\n");
    write(
        "a.rs",
        "use crate::B;\npub(crate) struct A;\n// crate::room::c is a comment\n",
    );
    write("room/mod.rs", "pub(crate) mod b;\n");
    write(
        "room/b.rs",
        "pub struct B(crate::a::A);\nconst S: &str = \"crate::a::A\";\n",
    );
    let found = circles(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("a.rs") && found[0].contains("room/b.rs"),
        "{}",
        found[0]
    );
    assert!(
        found[0].contains("crate::a::A") || found[0].contains("a::A"),
        "{}",
        found[0]
    );
}

#[test]
fn no_transport_file_is_over_800_lines() {
    let mut files = Vec::new();
    rust_files(&repo().join("src/transport"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f)
                .expect("readable")
                .lines()
                .count();
            (lines > TRANSPORT_MAX_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these files of src/transport (at most {TRANSPORT_MAX_LINES} lines): {long:?}"
    );
}
