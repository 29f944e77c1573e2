//! The configuration reference, `docs/reference/configuration.md`, is
//! generated from the code's own table of settings
//! (`src/config/settings.rs`): this test renders the table and fails when
//! the page differs (`RINGWIRE_BLESS=1 cargo test --test reference`
//! rewrites it). It also reads the sources of ringwire, ringwire-uring,
//! ringwire-shm, ringwire-gpu and the bench, and fails on a variable they
//! read that the table does not list, or a listed one nothing reads: a new
//! variable cannot be added undocumented.

use ringwire::config::settings::{INTERNAL, SETTINGS, Section, Setting};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const PAGE: &str = "docs/reference/configuration.md";

/// Source folders whose variables the table must list.
const SOURCES: &[&str] = &["src", "uring/src", "shm/src", "gpu/src", "benches/src"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The file name of decision `number` in docs/decisions.
fn decision_file(number: u16) -> String {
    let prefix = format!("{number:04}-");
    let dir = repo().join("docs/decisions");
    std::fs::read_dir(&dir)
        .expect("docs/decisions")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|name| name.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no decision {prefix}* in {}", dir.display()))
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn meaning(s: &Setting) -> String {
    let mut text = cell(s.meaning);
    if s.same_on_every_rank {
        text.push_str("; the same on every rank");
    }
    if let Some(n) = s.decision {
        text.push_str(&format!(" ([{n:04}](../decisions/{}))", decision_file(n)));
    }
    text
}

/// The page, rendered from the table.
fn render() -> String {
    let mut page = String::from(
        "# Configuration reference\n\
         \n\
         Every environment variable ringwire reads, one line each. This page is generated from\n\
         the code's table of settings (`src/config/settings.rs`); `cargo test --test reference`\n\
         fails when the two differ, and `RINGWIRE_BLESS=1 cargo test --test reference` rewrites\n\
         the page. The [guide](../guide/README.md) explains when to change what.\n\
         \n\
         How values are given:\n\
         \n\
         - A builder method wins over its variable; a variable it overrides is named in a warning\n\
         \x20 at start (with its value, unless it is the secret).\n\
         - `_BYTES` variables take `K`, `M` and `G` suffixes, binary multiples: `256K`, `4M`.\n\
         - On/off variables take `1`, `on`, `true`, `yes` and `0`, `off`, `false`, `no`, in any case.\n\
         - Seconds may have a fraction: `2.5`.\n\
         - A value a variable does not take stops the start with `Error::Env(EnvError::Invalid)`,\n\
         \x20 which names the variable, the value and what it takes.\n\
         - \"The same on every rank\": setup compares each rank's value with rank 0's, and every\n\
         \x20 rank fails at once naming the setting and both values when they differ.\n",
    );
    for section in Section::ALL {
        let rows: Vec<&Setting> = SETTINGS.iter().filter(|s| s.section == section).collect();
        if rows.is_empty() {
            continue;
        }
        page.push_str(&format!("\n## {}\n\n", section.title()));
        let mut guides: Vec<&str> = Vec::new();
        for s in &rows {
            if !guides.contains(&s.guide) {
                guides.push(s.guide);
            }
        }
        let links: Vec<String> = guides
            .iter()
            .map(|g| format!("[{g}](../guide/{g})"))
            .collect();
        if section == Section::Launch {
            page.push_str(
                "ringwire reads these; the launcher sets them. The first launcher whose rank \
                 variable is set wins,\nin this order: explicit (`RINGWIRE_*`), torchrun, Open MPI, \
                 Slurm, PMI ([decision 0025](../decisions/",
            );
            page.push_str(&decision_file(25));
            page.push_str(")). ");
        }
        page.push_str(&format!("Explained in {}.\n\n", links.join(", ")));
        if section == Section::Launch {
            page.push_str("| variable | meaning |\n|---|---|\n");
            for s in rows {
                page.push_str(&format!("| `{}` | {} |\n", s.name, meaning(s)));
            }
        } else {
            page.push_str("| variable | default | in code | meaning |\n|---|---|---|---|\n");
            for s in rows {
                let builder = s
                    .builder
                    .map_or_else(|| "-".to_string(), |b| format!("`{b}`"));
                page.push_str(&format!(
                    "| `{}` | {} | {} | {} |\n",
                    s.name,
                    cell(s.default),
                    builder,
                    meaning(s)
                ));
            }
        }
    }
    page
}

#[test]
fn the_configuration_reference_is_generated_from_the_code() {
    let path = repo().join(PAGE);
    let rendered = render();
    if std::env::var_os("RINGWIRE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("docs/reference");
        std::fs::write(&path, &rendered).expect("the page written");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let first = on_disk
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(on_disk.lines().count().min(rendered.lines().count()));
        panic!(
            "{PAGE} differs from src/config/settings.rs from line {}: rewrite it with \
             `RINGWIRE_BLESS=1 cargo test --test reference` and review the diff\n  on disk: {:?}\n  \
             rendered: {:?}",
            first + 1,
            on_disk.lines().nth(first),
            rendered.lines().nth(first)
        );
    }
}

#[test]
fn every_setting_appears_once() {
    let mut seen = BTreeSet::new();
    for s in SETTINGS {
        assert!(seen.insert(s.name), "{} is listed twice", s.name);
        assert!(!s.meaning.is_empty(), "{} has no meaning", s.name);
        assert!(
            s.section == Section::Launch || !s.default.is_empty(),
            "{} has no default",
            s.name
        );
        assert!(
            repo().join("docs/guide").join(s.guide).is_file(),
            "{}: no guide chapter {}",
            s.name,
            s.guide
        );
    }
    for (name, _) in INTERNAL {
        assert!(
            !seen.contains(name),
            "{name} is both a setting and internal"
        );
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The code without comments and without `#[cfg(test)] mod` blocks, and
/// its string literals.
fn code_and_strings(text: &str) -> (String, Vec<String>) {
    let chars: Vec<char> = text.chars().collect();
    let mut code = String::new();
    let mut strings = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            let mut s = String::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    s.push(chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    s.push(chars[i]);
                }
                i += 1;
            }
            i += 1;
            code.push('"');
            code.push_str(&s);
            code.push('"');
            strings.push(s);
        } else if c == '\'' && chars.get(i + 1) == Some(&'\\') {
            // An escaped character literal: '\n', '\'', '\u{..}'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            code.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            code.push_str("' '");
            i += 3;
        } else {
            code.push(c);
            i += 1;
        }
    }
    // Test modules come last in a file, as everywhere in this repository.
    if let Some(at) = code.find("#[cfg(test)]\nmod ") {
        let strings_before = code[..at].matches('"').count() / 2;
        strings.truncate(strings_before);
        code.truncate(at);
    }
    (code, strings)
}

fn is_launcher_variable(s: &str) -> bool {
    const NAMES: &[&str] = &[
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];
    const PREFIXES: &[&str] = &["TORCHELASTIC_", "OMPI_", "SLURM_", "PMI_", "PMIX_", "MPI_"];
    NAMES.contains(&s)
        || (PREFIXES.iter().any(|p| s.starts_with(p))
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// Every variable the sources read or name: `RINGWIRE_*` anywhere in their
/// code (strings included), and launchers' variables as string literals.
fn variables_in_sources() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for dir in SOURCES {
        let mut files = Vec::new();
        rust_files(&repo().join(dir), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable");
            let (code, strings) = code_and_strings(&text);
            let mut rest = code.as_str();
            while let Some(at) = rest.find("RINGWIRE_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(tail.len());
                let name = tail[..end].trim_end_matches('_');
                if name.len() > "RINGWIRE_".len() - 1 && name != "RINGWIRE" {
                    found.insert(name.to_string());
                }
                rest = &tail[end.max(1)..];
            }
            found.extend(strings.into_iter().filter(|s| is_launcher_variable(s)));
        }
    }
    found
}

#[test]
fn every_variable_the_code_reads_is_listed() {
    let found = variables_in_sources();
    let listed: BTreeSet<&str> = SETTINGS
        .iter()
        .map(|s| s.name)
        .chain(INTERNAL.iter().map(|(n, _)| *n))
        .collect();
    let unlisted: Vec<&String> = found
        .iter()
        .filter(|v| !listed.contains(v.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "the code reads or names {unlisted:?}, which src/config/settings.rs does not list: add \
         each to SETTINGS (it then appears in {PAGE}) or, for a test's own variable, to INTERNAL"
    );
    let stale: Vec<&&str> = listed.iter().filter(|v| !found.contains(**v)).collect();
    assert!(
        stale.is_empty(),
        "src/config/settings.rs lists {stale:?}, which no code reads: remove them"
    );
}
