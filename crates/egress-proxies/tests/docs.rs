//! The documentation against the code: `docs/requirements.md` must name every guarantee ID a
//! `finding: ID` tag uses anywhere in the repository (crates, scripts, CI), no ID that no tag
//! uses, only files that exist, and only test functions that exist in the file it names. So a
//! new tag without its requirement, a renamed or moved test, or a moved file fails here. No
//! network, no root.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` (recursively), skipping build output and hidden directories.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name == "target" || name.starts_with('.') {
                continue;
            }
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The IDs of a `finding:` tag's text after the colon: `H1`, `APX-3`, `L18, D5`, and the
/// prose after them (`— why`) ignored.
fn ids_of_tag(rest: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for word in rest.split([',', ' ']) {
        let w = word.trim();
        if w.is_empty() {
            continue;
        }
        let is_id = w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && w.chars().last().is_some_and(|c| c.is_ascii_digit())
            && w.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-');
        if !is_id {
            break;
        }
        ids.push(w.to_owned());
    }
    ids
}

/// Every ID named by a `finding:` tag in crates/, scripts/ and .ci/, with one place it is used.
fn tagged_ids() -> BTreeMap<String, String> {
    let root = repo();
    let mut files = Vec::new();
    for d in ["crates", "scripts", ".ci"] {
        files_under(&root.join(d), &mut files);
    }
    let mut ids = BTreeMap::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue; // binary files
        };
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(i) = rest.find("finding: ") {
                rest = &rest[i + "finding: ".len()..];
                for id in ids_of_tag(rest) {
                    let at = format!(
                        "{}:{}",
                        f.strip_prefix(&root).unwrap_or(&f).display(),
                        n + 1
                    );
                    ids.entry(id).or_insert(at);
                }
            }
        }
    }
    ids
}

/// One requirement of docs/requirements.md: its "Kept in" files and its "Proven by" tests
/// (file → test function names).
#[derive(Default, Debug)]
struct Requirement {
    kept_in: Vec<String>,
    proven_by: Vec<(String, Vec<String>)>,
}

/// The backticked spans of `s`, in order.
fn backticked(s: &str) -> Vec<String> {
    s.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, t)| t.to_owned())
        .collect()
}

fn requirements() -> BTreeMap<String, Requirement> {
    let text = std::fs::read_to_string(repo().join("docs/requirements.md")).unwrap();
    let mut out: BTreeMap<String, Requirement> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            let id = h.split(':').next().unwrap().trim().to_owned();
            assert!(
                ids_of_tag(&id) == vec![id.clone()],
                "docs/requirements.md: heading {line:?} must start with `ID:`"
            );
            assert!(
                out.insert(id.clone(), Requirement::default()).is_none(),
                "docs/requirements.md: {id} twice"
            );
            current = Some(id);
            continue;
        }
        let Some(id) = &current else { continue };
        let r = out.get_mut(id).unwrap();
        if let Some(rest) = line.strip_prefix("Kept in: ") {
            r.kept_in.extend(backticked(rest));
        } else if let Some(rest) = line.strip_prefix("- `") {
            let (file, tests) = rest
                .split_once("`: ")
                .unwrap_or_else(|| panic!("docs/requirements.md, {id}: bad line {line:?}"));
            r.proven_by.push((file.to_owned(), backticked(tests)));
        }
    }
    out
}

/// Where `fn name(` is defined in the repository's Rust files (for a helpful failure).
fn where_defined(name: &str) -> Vec<String> {
    let root = repo();
    let mut files = Vec::new();
    files_under(&root.join("crates"), &mut files);
    let needle = format!("fn {name}(");
    files
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains(&needle)))
        .map(|f| f.strip_prefix(&root).unwrap_or(&f).display().to_string())
        .collect()
}

#[test]
fn every_tagged_guarantee_is_documented_and_every_documented_one_is_tagged() {
    let tagged = tagged_ids();
    let documented = requirements();
    assert!(
        tagged.len() > 40,
        "the tag scan found too little: {tagged:?}"
    );
    let missing: Vec<String> = tagged
        .iter()
        .filter(|(id, _)| !documented.contains_key(*id))
        .map(|(id, at)| format!("{id} (tagged at {at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "IDs used in `finding:` tags but missing from docs/requirements.md: {missing:?}"
    );
    let stale: Vec<&String> = documented
        .keys()
        .filter(|id| !tagged.contains_key(*id))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/requirements.md documents IDs no `finding:` tag uses: {stale:?}"
    );
}

#[test]
fn every_file_and_test_the_requirements_name_exists() {
    let root = repo();
    let mut problems = Vec::new();
    for (id, r) in requirements() {
        if r.kept_in.is_empty() {
            problems.push(format!("{id}: no `Kept in:` files"));
        }
        for f in &r.kept_in {
            // A module split into a folder keeps its name: `gc.rs` may become `gc/`.
            let p = root.join(f);
            let as_dir = root.join(f.trim_end_matches(".rs"));
            if !p.exists() && !as_dir.is_dir() {
                problems.push(format!("{id}: kept in {f}, which does not exist"));
            }
        }
        if r.proven_by.iter().all(|(_, t)| t.is_empty()) {
            problems.push(format!("{id}: no test under `Proven by:`"));
        }
        for (file, tests) in &r.proven_by {
            let Ok(text) = std::fs::read_to_string(root.join(file)) else {
                problems.push(format!("{id}: {file} does not exist"));
                continue;
            };
            for t in tests {
                if !text.contains(&format!("fn {t}(")) {
                    problems.push(format!(
                        "{id}: test {t} is not in {file} (defined in: {:?})",
                        where_defined(t)
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/requirements.md is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_tag_parser_reads_ids_and_stops_at_prose() {
    assert_eq!(ids_of_tag("H1"), ["H1"]);
    assert_eq!(ids_of_tag("L18, D5"), ["L18", "D5"]);
    assert_eq!(ids_of_tag("APX-3 — a frozen host"), ["APX-3"]);
    assert_eq!(ids_of_tag("M15 — a failed list sweeps nothing."), ["M15"]);
    assert!(ids_of_tag("the list").is_empty());
}

#[test]
fn every_module_path_the_architecture_names_exists() {
    let root = repo();
    let text = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut base: Option<String> = None;
    let mut problems = Vec::new();
    let mut checked = 0;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            // `### `crates/NAME` (role)`: the table below names paths inside that crate.
            base = backticked(h).into_iter().find(|s| s.starts_with("crates/"));
            continue;
        }
        let (Some(b), Some(row)) = (&base, line.strip_prefix("| ")) else {
            continue;
        };
        let first_cell = row.split(" | ").next().unwrap_or_default();
        for span in backticked(first_cell) {
            let rel = if span.starts_with("src/") {
                format!("{b}/{span}")
            } else if b.ends_with("testing/") || b.ends_with("testing") {
                format!("{}/{span}", b.trim_end_matches('/'))
            } else {
                continue;
            };
            checked += 1;
            if !root.join(&rel).exists() {
                problems.push(rel);
            }
        }
    }
    assert!(
        checked > 30,
        "too few module paths found in docs/architecture.md: {checked}"
    );
    assert!(
        problems.is_empty(),
        "docs/architecture.md names paths that do not exist: {problems:?}"
    );
}

/// Every key of `v` (objects inside arrays included), recursively.
fn json_keys(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                out.insert(k.clone());
                json_keys(x, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_keys(x, out)),
        _ => {}
    }
}

#[test]
fn every_field_of_the_status_document_is_documented_for_users() {
    use egress_core::model::{Condition, ConditionStatus, HealthStatus, Phase};
    use egress_web::status::{HostStatusRow, ProxyStatusRow, StatusDocument};
    // Every optional field set, so every key is serialized.
    let doc = StatusDocument {
        generated_at: "2026-01-01T00:00:00Z".into(),
        proxies: vec![ProxyStatusRow {
            namespace: "default".into(),
            name: "p1".into(),
            uid: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            phase: Phase::Running,
            host: Some("h1".into()),
            ip: Some("192.0.2.1".into()),
            provider_id: Some("libvirt://local/h1/x".into()),
            created_at: "2026-01-01T00:00:00Z".into(),
            last_error: Some("e".into()),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: ConditionStatus::True,
                reason: "Ready".into(),
                message: "m".into(),
                last_transition_time: "2026-01-01T00:00:00Z".into(),
                observed_generation: 1,
            }],
            port: Some(3128),
            health: Some(HealthStatus {
                healthy: Some(true),
                egress_ip: Some("203.0.113.7".into()),
                last_check: Some("2026-01-01T00:00:00Z".into()),
                latency_ms: Some(3),
                consecutive_failures: 0,
                consecutive_successes: 2,
                last_error: Some("e".into()),
                egress_ips: vec!["203.0.113.7".into()],
            }),
            reputation: Some(egress_core::reputation::ProxyReputation {
                addresses: vec!["203.0.113.7".into()],
                listed: vec![egress_core::reputation::engine::status::ListingStatus {
                    address: "203.0.113.7".into(),
                    zone: "bl.example".into(),
                    since: "2026-01-01T00:00:00Z".into(),
                    codes: vec!["SBL".into()],
                }],
                failed: vec![egress_core::reputation::engine::status::FailedCheck {
                    address: "203.0.113.7".into(),
                    zone: "zen.example".into(),
                    since: "2026-01-01T00:00:00Z".into(),
                    reason: "timeout".into(),
                    message: "m".into(),
                }],
                last_check: Some("2026-01-01T00:00:00Z".into()),
            }),
            egress_address: vec!["203.0.113.7".into()],
        }],
        hosts: vec![HostStatusRow {
            entry: "local".into(),
            host: "h1".into(),
            state: "Ready".into(),
            latency_ms: Some(3),
            error: Some("e".into()),
            maintenance: Some("Draining (1 left)".into()),
            addresses: vec![egress_core::host_health::AddressPoolUsage {
                family: "IPv4".into(),
                size: 4,
                held: 1,
                retired: 1,
                free: 2,
            }],
            fenced: Some(egress_core::host_health::HostFence {
                reason: "rack 4 unplugged".into(),
                state: "Applied".into(),
                applied_at: Some("2026-01-01T00:00:00Z".into()),
                freed: vec!["203.0.113.7".into()],
                message: Some("m".into()),
            }),
        }],
        manifest_errors: vec!["a.yaml: bad".into()],
        pools: vec![egress_web::status::PoolStatusRow {
            namespace: "default".into(),
            name: "web".into(),
            desired: 2,
            status: egress_core::pool::ProxyPoolStatus {
                conditions: vec![Condition {
                    type_: "Available".into(),
                    status: ConditionStatus::True,
                    reason: "MinimumReplicasAvailable".into(),
                    message: "m".into(),
                    last_transition_time: "2026-01-01T00:00:00Z".into(),
                    observed_generation: 1,
                }],
                template_hash: "abc".into(),
                host_failures: vec![egress_core::pool::status::HostFailures {
                    host: "h1".into(),
                    count: 1,
                    last_failure: "2026-01-01T00:00:00Z".into(),
                    message: "m".into(),
                }],
                quarantined: vec!["web-b".into()],
                selector: "egress-proxies.dev/pool=web".into(),
                members: vec![egress_core::pool::status::PoolMemberStatus {
                    name: "web-b".into(),
                    host: Some("h1".into()),
                    phase: Phase::Running,
                    ip: Some("192.0.2.1".into()),
                    egress_ip: Some("203.0.113.7".into()),
                    egress_address: vec!["203.0.113.7".into()],
                    available: true,
                    quarantined: true,
                    draining_since: Some("2026-01-01T00:00:00Z".into()),
                }],
                members_omitted: 1,
                retired_addresses: vec![egress_core::pool::status::RetiredAddress {
                    host: "h1".into(),
                    address: "203.0.113.9".into(),
                    member: "web-a".into(),
                    reason: "listed".into(),
                    since: "2026-01-01T00:00:00Z".into(),
                    until: "2026-01-08T00:00:00Z".into(),
                }],
                ..Default::default()
            },
            members: vec![egress_web::status::PoolMemberRow {
                name: "web-b".into(),
                host: Some("h1".into()),
                phase: Phase::Running,
                available: true,
                template_hash: "abc".into(),
                created_at: "2026-01-01T00:00:00Z".into(),
                quarantine: Some("banned".into()),
                deleting: true,
                egress_address: vec!["203.0.113.7".into()],
                draining_since: None,
            }],
            error: Some("e".into()),
        }],
    };
    let mut keys = std::collections::BTreeSet::new();
    json_keys(&serde_json::to_value(&doc).unwrap(), &mut keys);
    assert!(keys.len() > 20, "{keys:?}");
    let ops = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let start = ops
        .find("## The `/status` document")
        .expect("docs/operations.md has a section on the /status document");
    let section = &ops[start + 3..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let documented: BTreeMap<String, ()> = backticked(section)
        .into_iter()
        .flat_map(|s| {
            s.split(['.', '[', ']', ','])
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(|w| (w.to_owned(), ()))
                .collect::<Vec<_>>()
        })
        .collect();
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !documented.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "fields of GET /status that docs/operations.md does not document: {missing:?}"
    );
}

// ---------------------------------------------------------------- the test tables

/// Every target whose tests `cargo test --workspace --all-targets` runs, as the command that
/// runs it alone: `cargo test -p PACKAGE --lib`, `--bin NAME` or `--test NAME` (from `cargo
/// metadata`, so a target added by file or by `[[test]]` is found alike).
fn workspace_test_targets() -> std::collections::BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut targets = std::collections::BTreeSet::new();
    for p in meta["packages"].as_array().unwrap() {
        let package = p["name"].as_str().unwrap();
        for t in p["targets"].as_array().unwrap() {
            if t["test"] != serde_json::Value::Bool(true) {
                continue;
            }
            let name = t["name"].as_str().unwrap();
            let kinds: Vec<&str> = t["kind"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|k| k.as_str())
                .collect();
            let which = if kinds.contains(&"test") {
                format!("--test {name}")
            } else if kinds.contains(&"bin") {
                format!("--bin {name}")
            } else if kinds.iter().any(|k| k.ends_with("lib")) {
                "--lib".to_owned()
            } else {
                continue; // examples and benches are built, not run as tests
            };
            targets.insert(format!("cargo test -p {package} {which}"));
        }
    }
    targets
}

/// The commands in the first column of docs/testing.md's tables.
fn documented_test_targets() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs/testing.md")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("| `cargo test -p "))
        .map(|rest| {
            let cmd = rest.split('`').next().unwrap_or_default();
            format!("cargo test -p {cmd}")
        })
        .collect()
}

#[test]
fn every_test_target_of_the_workspace_has_its_row_in_the_test_tables() {
    let targets = workspace_test_targets();
    assert!(
        targets.len() > 80 && targets.contains("cargo test -p egress-standalone --test soak"),
        "cargo metadata found too few targets: {targets:?}"
    );
    let rows = documented_test_targets();
    let mut seen = std::collections::BTreeSet::new();
    let twice: Vec<&String> = rows.iter().filter(|r| !seen.insert(r.as_str())).collect();
    assert!(twice.is_empty(), "docs/testing.md lists twice: {twice:?}");
    let missing: Vec<&String> = targets
        .iter()
        .filter(|t| !seen.contains(t.as_str()))
        .collect();
    let stale: Vec<&&str> = seen.iter().filter(|r| !targets.contains(**r)).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/testing.md's test tables drifted from the workspace's test targets:\n\
         no row (add one: the command, what it needs, what it covers): {missing:?}\n\
         rows naming no target: {stale:?}"
    );
}

// ---------------------------------------------------------------- the README

/// Longest sentence, in words, in the README and the pages it sends users to first.
// NB: the README once had a 146-word sentence; 35 words is two lines of prose.
const MAX_SENTENCE_WORDS: usize = 35;

/// The prose sentences of a Markdown text: code blocks, indented blocks, tables, headings and
/// images left out; list items and paragraphs are split at a `.`, `!` or `?` followed by a
/// space and a capital, a digit or markup.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut para: Vec<String> = Vec::new();
    let mut fence = false;
    let flush = |para: &mut Vec<String>, out: &mut Vec<String>| {
        if para.is_empty() {
            return;
        }
        let joined = para.join(" ");
        para.clear();
        let chars: Vec<char> = joined.chars().collect();
        let mut start = 0;
        for i in 0..chars.len() {
            let ends = matches!(chars[i], '.' | '!' | '?')
                && chars.get(i + 1) == Some(&' ')
                && chars.get(i + 2).is_some_and(|c| {
                    c.is_uppercase() || c.is_ascii_digit() || "`([*\"".contains(*c)
                });
            if ends {
                out.push(chars[start..=i].iter().collect());
                start = i + 2;
            }
        }
        if start < chars.len() {
            out.push(chars[start..].iter().collect());
        }
    };
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            fence = !fence;
            flush(&mut para, &mut out);
            continue;
        }
        if fence || (line.starts_with("    ") && para.is_empty()) {
            continue;
        }
        if t.is_empty() || t.starts_with('|') || t.starts_with('#') || t.starts_with("![") {
            flush(&mut para, &mut out);
            continue;
        }
        let item = t
            .strip_prefix("- ")
            .or_else(|| t.strip_prefix("* "))
            .or_else(|| {
                let (n, rest) = t.split_once(". ")?;
                n.chars().all(|c| c.is_ascii_digit()).then_some(rest)
            });
        if let Some(rest) = item {
            flush(&mut para, &mut out);
            para.push(rest.to_owned());
        } else {
            para.push(t.to_owned());
        }
    }
    flush(&mut para, &mut out);
    out
}

#[test]
fn the_sentence_splitter_splits_prose_and_skips_code_and_tables() {
    let text = "# Title\n\nOne two. Three `four` five.\nSix (`x`).\n\n```sh\nnot. Prose.\n```\n\n\
                | a. B | c |\n\n- Item one. Item two\n  goes on.\n1. Numbered.\n";
    assert_eq!(
        sentences(text),
        [
            "One two.",
            "Three `four` five.",
            "Six (`x`).",
            "Item one.",
            "Item two goes on.",
            "Numbered."
        ]
    );
}

#[test]
fn the_readme_says_what_it_is_gives_the_two_commands_and_stays_short() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() <= 150,
        "README.md has {} lines: keep it a short tour and move details to docs/",
        lines.len()
    );
    // A title, two lines saying what this is, then the two commands of a fresh machine.
    let fence = lines
        .iter()
        .position(|l| l.starts_with("```"))
        .expect("a code block");
    let prose: Vec<&&str> = lines[1..fence]
        .iter()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        lines[0].starts_with("# ") && prose.len() == 2,
        "README.md starts with its title and two lines: {prose:?}"
    );
    let end = fence
        + 1
        + lines[fence + 1..]
            .iter()
            .position(|l| l.starts_with("```"))
            .expect("the code block ends");
    let commands: Vec<&str> = lines[fence + 1..end]
        .iter()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        commands,
        ["./scripts/quickstart", "./scripts/test"],
        "the first code block holds exactly the two commands"
    );
    for script in ["scripts/quickstart", "scripts/test"] {
        let mode = std::fs::metadata(repo().join(script))
            .unwrap()
            .permissions();
        assert!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o111 != 0,
            "{script} is executable"
        );
    }
    for doc in ["README.md", "docs/usage.md", "docs/kubernetes.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        let all = sentences(&text);
        assert!(all.len() > 20, "{doc}: too few sentences found: {all:?}");
        let long: Vec<(usize, &String)> = all
            .iter()
            .map(|s| (s.split_whitespace().count(), s))
            .filter(|(n, _)| *n > MAX_SENTENCE_WORDS)
            .collect();
        assert!(
            long.is_empty(),
            "{doc}: sentences over {MAX_SENTENCE_WORDS} words: {long:#?}"
        );
    }
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_names_a_file_that_exists() {
    let root = repo();
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = rest.split(')').next().unwrap_or_default();
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            let dir = page.parent().unwrap();
            if !dir.join(path).exists() {
                broken.push(format!(
                    "{}: {target}",
                    page.strip_prefix(&root).unwrap_or(page).display()
                ));
            }
        }
    }
    assert!(pages.len() > 10, "{pages:?}");
    assert!(
        broken.is_empty(),
        "links to files that do not exist: {broken:#?}"
    );
}

// ---------------------------------------------------------------- long files

/// Longest product source file that needs no reason in its module doc.
const LONG_FILE_LINES: usize = 600;

/// The reason a long file gives in its module doc: the `//!` paragraph that starts with
/// `One piece`, if it says more than the two words (at least [`MIN_REASON_WORDS`] words).
fn long_file_reason(text: &str) -> Option<String> {
    let doc: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim())
        .collect();
    let start = doc.iter().position(|l| l.starts_with("One piece"))?;
    let paragraph = doc[start..]
        .iter()
        .take_while(|l| !l.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    (paragraph.split_whitespace().count() >= MIN_REASON_WORDS).then_some(paragraph)
}

/// Fewest words a long file's reason may have: enough to name what would drift if split.
const MIN_REASON_WORDS: usize = 15;

#[test]
fn every_product_file_over_600_lines_says_in_its_module_doc_why_it_is_one_piece() {
    let mut files = Vec::new();
    files_under(&repo().join("crates"), &mut files);
    let mut checked = 0;
    let mut missing = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(repo())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let name = f.file_name().unwrap().to_string_lossy();
        let product = rel.ends_with(".rs")
            && rel.contains("/src/")
            && !rel.starts_with("crates/testing/")
            && !rel.contains("/tests/")
            && name != "tests.rs"
            && !name.ends_with("_tests.rs");
        if !product {
            continue;
        }
        checked += 1;
        let text = std::fs::read_to_string(&f).unwrap();
        let lines = text.lines().count();
        if lines > LONG_FILE_LINES && long_file_reason(&text).is_none() {
            missing.push(format!("{rel} ({lines} lines)"));
        }
    }
    assert!(
        checked > 100,
        "only {checked} product files found: wrong root?"
    );
    assert!(
        missing.is_empty(),
        "product files over {LONG_FILE_LINES} lines without a `//! One piece …` paragraph in \
         their module doc saying why they are not split (see docs/architecture.md, \"Long \
         files\"), or split them: {missing:?}"
    );
}

#[test]
fn a_long_file_reason_is_a_module_doc_paragraph_of_its_own() {
    let why = "//! The job.\n//!\n//! One piece: the parser, the tree and the deserializer share \
               one private\n//! node type; split, each would export it to the others.\n\nuse x;\n";
    assert!(
        long_file_reason(why)
            .unwrap()
            .starts_with("One piece: the parser")
    );
    // Two words are no reason.
    assert_eq!(long_file_reason("//! Job.\n//!\n//! One piece.\n"), None);
    // Outside the module doc (a comment further down) does not count.
    let later = "//! The job.\n\n// One piece: the parser, the tree and the deserializer share one \
                 private node type; split, each would export it.\n";
    assert_eq!(long_file_reason(later), None);
    assert_eq!(long_file_reason("//! Only the job, no reason.\n"), None);
}
