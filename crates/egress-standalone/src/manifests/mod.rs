//! Proxy manifests in a directory: parsing, validation, stable UIDs and generations.
//!
//! Guarantees:
//! - Every `*.yaml`/`*.yml` file directly in the directory is read (no recursion, no hidden
//!   files); each may hold several `---` documents, each a [`ProxyManifest`] or (`kind:
//!   ProxyPool`) a pool (`pool.rs`), kept by the same rules.
//! - Every error names the file, the document index (0-based) and the field path
//!   (`spec.proxy.port`); a shape error (wrong type, unknown or missing field) too, reported
//!   alongside every other error of its document (see
//!   [`egress_core::config::lenient`]); only a YAML syntax error is reported alone, with
//!   serde-saphyr's line and column.
//! - **Nothing lost on bad input.** A file that fails to read or parse keeps the proxies of
//!   its last good version; only a file that is removed (or parses to fewer proxies) drops
//!   proxies. An unreadable directory changes nothing.
//! - UIDs are stable per namespace/name ([`uid_for`]): a restart finds the same instances by
//!   the UIDs in their marks. A generation counter is bumped whenever the spec (or the
//!   credentials it references) changes.
//! - Credentials files are read at load and never logged ([`Credentials`]'s `Debug` hides
//!   the password). A `credentialsRef` names a file inside the manifest directory only (no
//!   absolute path, no `..`, no link resolving outside it: [`resolve_in_dir`]); it and every
//!   manifest are read with a hard bound, and only when they are regular files (a FIFO or a
//!   device is refused without blocking: [`read_regular_bounded`]).
//!
//! One piece (about 610 lines before its tests, 480 of them code): reading a directory,
//! document splitting, validation and the UID/generation bookkeeping are one pass over one
//! snapshot of the directory whose "nothing lost on bad input" rule spans all of them; the
//! bounded and confined file reads are `files.rs`, the pool documents `pool.rs`, and the
//! lenient field reader it builds on lives in `egress_core::config`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use egress_provider::ProxyUid;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use egress_core::config::lenient;
use egress_core::model::{API_VERSION, KIND, ProxyManifest, ProxySpec};

mod files;
pub(crate) mod pool;

pub use self::files::{
    Credentials, MAX_CREDENTIALS_BYTES, ManifestError, read_regular_bounded, resolve_in_dir,
};
use self::files::{is_dns_label, read_credentials};
pub use self::pool::LoadedPool;

/// The namespace UUID under which standalone Proxy UIDs are derived (UUIDv5 of
/// `"<namespace>/<name>"`). Fixed forever: changing it would orphan every instance.
// NB: a random v4 UUID generated once for this project, so no other UUIDv5 user collides.
pub const UID_NAMESPACE: Uuid = uuid::uuid!("6d1f3a52-8c4e-4f0b-9a57-2e0c8d7b41a9");

/// Largest manifest (or credentials) file read.
// NB: a manifest is a few hundred bytes; 1000 proxies in one file are ~400 KiB. 4 MiB bounds
// a wrong file (an image, a log) dropped into the directory.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Most manifest files in the directory; a directory holding more is refused as a whole (as
/// if it could not be listed: nothing is deleted, the previous set stays).
// NB: one file per proxy; the operator is benchmarked at 20,000 proxies
// (docs/benchmarks.md), and 100,000 bounds a wrong directory. Refusing rather than reading the
// first N: a partial listing (in directory order) would drop, hence delete, the others.
pub const MAX_MANIFEST_FILES: usize = 100_000;

/// The stable UID of the Proxy `namespace/name` in standalone mode: UUIDv5 under
/// [`UID_NAMESPACE`]. Same inputs, same UID, on every run and every machine.
pub fn uid_for(namespace: &str, name: &str) -> ProxyUid {
    ProxyUid(Uuid::new_v5(
        &UID_NAMESPACE,
        format!("{namespace}/{name}").as_bytes(),
    ))
}

/// One valid Proxy from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedProxy {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// [`uid_for`]`(namespace, name)`.
    pub uid: ProxyUid,
    /// The validated spec (shared with the object the controller sees).
    pub spec: Arc<ProxySpec>,
    /// Credentials read from `spec.proxy.credentialsRef`, when set.
    pub credentials: Option<Credentials>,
    /// The file it came from.
    pub file: PathBuf,
    /// sha256 over the spec and the credentials: changes exactly when either does.
    pub spec_hash: [u8; 32],
}

impl LoadedProxy {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Splits YAML text into documents at `---` lines (column 0), keeping each document's first
/// line number for messages. A leading `---` does not create an empty document.
// NB: parsing each document on its own (rather than serde-saphyr's `from_multiple`, which
// fails the whole stream at the first bad document) is what lets us name the document index
// and still report every document's errors. A `---` at column 0 always separates documents
// in YAML (block-scalar content is indented), so the split is exact for manifests.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut cur = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let is_sep = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if is_sep {
            if !cur.trim().is_empty() {
                docs.push((start, std::mem::take(&mut cur)));
            }
            cur.clear();
            start = i + 2;
            if let Some(rest) = line.strip_prefix("---")
                && !rest.trim().is_empty()
            {
                cur.push_str(rest);
                cur.push('\n');
            }
        } else if line == "..." {
            // Document end marker: the rest until the next `---` is ignored by YAML too.
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    if !cur.trim().is_empty() {
        docs.push((start, cur));
    }
    docs
}

/// Whether a document is only comments and blank lines.
fn is_blank_document(doc: &str) -> bool {
    doc.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#')
    })
}

/// Parses one manifest file's text. Returns the valid proxies and every error; a file with
/// any error should be treated as bad as a whole by the caller (see [`ManifestStore`]).
/// `dir` resolves relative `credentialsRef` paths. Reads only the credentials files.
pub fn parse_file(file: &Path, text: &str, dir: &Path) -> (Vec<LoadedProxy>, Vec<ManifestError>) {
    let (proxies, _, errs) = parse_file_with_pools(file, text, dir);
    (proxies, errs)
}

/// [`parse_file`], with the file's ProxyPools too.
pub fn parse_file_with_pools(
    file: &Path,
    text: &str,
    dir: &Path,
) -> (Vec<LoadedProxy>, Vec<LoadedPool>, Vec<ManifestError>) {
    let mut pools = Vec::new();
    let mut out = Vec::new();
    let mut errs = Vec::new();
    let mut doc_index = 0usize;
    for (first_line, doc) in split_documents(text) {
        if is_blank_document(&doc) {
            continue;
        }
        let d = doc_index;
        doc_index += 1;
        if pool::is_pool_document(&doc) {
            match pool::parse_pool(file, d, &doc, dir) {
                Ok(p) => pools.push(p),
                Err(e) => errs.extend(e),
            }
            continue;
        }
        // Shape errors first (each with its path), then the rule errors of what remains, not
        // repeating a rule error at a field whose shape was already wrong.
        let (parsed, mut shape) = match serde_saphyr::from_str::<ProxyManifest>(&doc) {
            Ok(m) => (Some(m), None),
            Err(e) => match lenient::parse_collecting::<ProxyManifest>(&doc) {
                Ok(c) if !c.errors.is_empty() => (None, Some(c)),
                Ok(_) | Err(_) => {
                    errs.push(ManifestError {
                        file: file.to_path_buf(),
                        document: Some(d),
                        path: String::new(),
                        message: egress_provider::error::redact(&format!(
                            "not a Proxy manifest (document starts at line {first_line}): {}",
                            without_input_label(&e.to_string())
                        )),
                    });
                    continue;
                }
            },
        };
        let mut ok = true;
        let parsed = match (parsed, shape.as_mut()) {
            (Some(m), _) => Some(m),
            (None, Some(c)) => {
                for e in &c.errors {
                    errs.push(ManifestError {
                        file: file.to_path_buf(),
                        document: Some(d),
                        path: e.path.clone(),
                        message: egress_provider::error::redact(&e.message),
                    });
                }
                ok = false;
                c.value.take()
            }
            (None, None) => None,
        };
        let Some(m) = parsed else {
            continue;
        };
        let mut err = |path: &str, message: String| {
            if shape.as_ref().is_some_and(|c| c.covers(path)) {
                return;
            }
            errs.push(ManifestError {
                file: file.to_path_buf(),
                document: Some(d),
                path: path.to_owned(),
                message: egress_provider::error::redact(&message),
            })
        };

        if m.api_version != API_VERSION {
            err(
                "apiVersion",
                format!("{:?} is not {API_VERSION:?}", m.api_version),
            );
            ok = false;
        }
        if m.kind != KIND {
            err("kind", format!("{:?} is not {KIND:?}", m.kind));
            ok = false;
        }
        for (field, v) in [
            ("metadata.name", &m.metadata.name),
            ("metadata.namespace", &m.metadata.namespace),
        ] {
            if !is_dns_label(v) {
                err(
                    field,
                    format!(
                        "{v:?} is not a DNS label (1 to 63 of a-z 0-9 -, starting and ending \
                         with a letter or digit)"
                    ),
                );
                ok = false;
            }
        }
        for e in m.spec.validate() {
            err(&e.path, e.message);
            ok = false;
        }
        let credentials = match &m.spec.proxy.credentials_ref {
            Some(r) => match read_credentials(dir, r) {
                Ok(c) => Some(c),
                Err(e) => {
                    err("spec.proxy.credentialsRef", e);
                    ok = false;
                    None
                }
            },
            None => None,
        };
        if !ok {
            continue;
        }
        let mut h = Sha256::new();
        h.update(format!("{:?}", m.spec).as_bytes());
        if let Some(c) = &credentials {
            h.update(b"\0creds\0");
            h.update(c.username.as_bytes());
            h.update(b"\0");
            h.update(c.password.as_bytes());
        }
        let spec_hash: [u8; 32] = h.finalize().into();
        out.push(LoadedProxy {
            uid: uid_for(&m.metadata.namespace, &m.metadata.name),
            namespace: m.metadata.namespace,
            name: m.metadata.name,
            spec: Arc::new(m.spec),
            credentials,
            file: file.to_path_buf(),
            spec_hash,
        });
    }
    (out, pools, errs)
}

/// serde-saphyr's message without the `<input>` label it gives text that has no file name
/// (the error already names the file and the document).
fn without_input_label(msg: &str) -> String {
    msg.replace(" --> <input>", "")
        .replace("<input>:", "line ")
        .replace("<input>", "the document")
}

/// What the store remembers of one file.
#[derive(Debug, Clone)]
struct FileState {
    /// (mtime, size) at the last read, and the credentials files' (path, mtime, size).
    stamp: Stamp,
    /// sha256 of the content last read.
    content_hash: [u8; 32],
    /// The proxies of the last good version (empty when it never parsed); shared with the
    /// [`Desired`] sets built from them (one copy of each Proxy, however many scans).
    good: Vec<Arc<LoadedProxy>>,
    /// The pools of the last good version.
    good_pools: Vec<Arc<LoadedPool>>,
    /// The errors of the current version (empty when it is good).
    errors: Vec<ManifestError>,
}

/// A cheap change detector: the file's mtime and size plus those of the credentials files
/// its last version referenced.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    file: (Option<SystemTime>, u64),
    creds: Vec<(PathBuf, Option<SystemTime>, u64)>,
}

fn file_stamp(p: &Path) -> (Option<SystemTime>, u64) {
    match std::fs::metadata(p) {
        Ok(m) => (m.modified().ok(), m.len()),
        Err(_) => (None, u64::MAX),
    }
}

/// The desired set after a scan.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    /// Every proxy by UID, with its generation (shared: a scan that found no change hands
    /// back the previous set without copying it).
    pub proxies: Arc<BTreeMap<ProxyUid, (Arc<LoadedProxy>, i64)>>,
    /// Every ProxyPool by `namespace/name`, with its generation.
    pub pools: Arc<BTreeMap<String, (Arc<LoadedPool>, i64)>>,
    /// Every current error (bad files, bad documents, duplicates), as display strings.
    pub errors: Vec<String>,
    /// Whether the directory itself could be listed (when false the set is the previous one).
    pub directory_ok: bool,
    /// True when nothing was re-read, added or removed since the previous scan, which
    /// listed the directory too: the set is the previous scan's, so a caller that applied
    /// that one has nothing to do.
    pub unchanged: bool,
}

/// The watched directory's state: the last good version of every file and a generation per
/// Proxy. Call [`ManifestStore::scan`] periodically.
#[derive(Debug)]
pub struct ManifestStore {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    generations: HashMap<ProxyUid, ([u8; 32], i64)>,
    pool_generations: HashMap<String, ([u8; 32], i64)>,
    last: Desired,
    /// [`MAX_MANIFEST_FILES`] (tests lower it).
    max_files: usize,
}

impl ManifestStore {
    /// A store for `dir`; nothing is read until [`scan`](Self::scan).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
            generations: HashMap::new(),
            pool_generations: HashMap::new(),
            last: Desired::default(),
            max_files: MAX_MANIFEST_FILES,
        }
    }

    /// The directory watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Re-reads what changed (by mtime, size, then content hash) and returns the desired
    /// set. A file that became bad keeps its last good proxies; a removed file drops its
    /// proxies; an unreadable directory returns the previous set with `directory_ok: false`.
    /// Duplicate namespace/name across files: the first file (by path) wins, the others are
    /// reported. Generations start at 1 and are bumped when a proxy's spec hash changes.
    pub fn scan(&mut self) -> Desired {
        let listing = match self.list() {
            Ok(l) => l,
            Err(e) => {
                // The next good listing rebuilds the set (it is not `unchanged`).
                self.last.directory_ok = false;
                let mut d = self.last.clone();
                d.errors.insert(
                    0,
                    format!(
                        "{}: cannot list the manifest directory: {e}",
                        self.dir.display()
                    ),
                );
                return d;
            }
        };
        // `listing` is sorted: a binary search keeps this O(n log n) per scan (a linear
        // `contains` made it quadratic in the number of files).
        let files_before = self.files.len();
        self.files.retain(|p, _| listing.binary_search(p).is_ok());
        let mut changed = self.files.len() != files_before || !self.last.directory_ok;
        for path in &listing {
            let stamp_file = file_stamp(path);
            if let Some(st) = self.files.get(path) {
                let creds_same = st
                    .stamp
                    .creds
                    .iter()
                    .all(|(p, m, s)| file_stamp(p) == (*m, *s));
                if st.stamp.file == stamp_file && creds_same {
                    continue;
                }
            }
            self.read_file(path, stamp_file);
            changed = true;
        }
        if !changed {
            // NB: the common case of a poll: no copy of the set (an Arc), no walk of it.
            return Desired {
                unchanged: true,
                ..self.last.clone()
            };
        }
        let mut desired = Desired {
            directory_ok: true,
            ..Desired::default()
        };
        let mut proxies = BTreeMap::new();
        let mut seen: HashMap<ProxyUid, PathBuf> = HashMap::new();
        for (path, st) in &self.files {
            desired
                .errors
                .extend(st.errors.iter().map(ToString::to_string));
            for p in &st.good {
                if let Some(first) = seen.get(&p.uid) {
                    desired.errors.push(format!(
                        "{}: duplicate Proxy {}: already defined in {}; this one is ignored",
                        path.display(),
                        p.key(),
                        first.display()
                    ));
                    continue;
                }
                seen.insert(p.uid, path.clone());
                let gen_entry = self.generations.entry(p.uid).or_insert((p.spec_hash, 1));
                if gen_entry.0 != p.spec_hash {
                    *gen_entry = (p.spec_hash, gen_entry.1.saturating_add(1));
                }
                proxies.insert(p.uid, (Arc::clone(p), gen_entry.1));
            }
        }
        let mut pools = BTreeMap::new();
        let mut pool_seen: HashMap<String, PathBuf> = HashMap::new();
        for (path, st) in &self.files {
            for p in &st.good_pools {
                let key = p.key();
                if let Some(first) = pool_seen.get(&key) {
                    desired.errors.push(format!(
                        "{}: duplicate ProxyPool {key}: already defined in {}; this one is ignored",
                        path.display(),
                        first.display()
                    ));
                    continue;
                }
                pool_seen.insert(key.clone(), path.clone());
                let g = self
                    .pool_generations
                    .entry(key.clone())
                    .or_insert((p.spec_hash, 1));
                if g.0 != p.spec_hash {
                    *g = (p.spec_hash, g.1.saturating_add(1));
                }
                pools.insert(key, (Arc::clone(p), g.1));
            }
        }
        desired.pools = Arc::new(pools);
        desired.proxies = Arc::new(proxies);
        self.last = desired.clone();
        desired
    }

    fn list(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for ent in std::fs::read_dir(&self.dir)? {
            let ent = ent?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
                continue;
            }
            let path = ent.path();
            if !path.is_file() {
                continue;
            }
            out.push(path);
            if out.len() > self.max_files {
                return Err(std::io::Error::other(format!(
                    "more than {} manifest files; refusing a partial listing",
                    self.max_files
                )));
            }
        }
        out.sort();
        Ok(out)
    }

    fn read_file(&mut self, path: &Path, stamp_file: (Option<SystemTime>, u64)) {
        let bad = |msg: String| ManifestError {
            file: path.to_path_buf(),
            document: None,
            path: String::new(),
            message: msg,
        };
        let text = if stamp_file.1 > MAX_MANIFEST_BYTES {
            Err(bad(format!(
                "the file is {} bytes; a manifest file is at most {MAX_MANIFEST_BYTES}",
                stamp_file.1
            )))
        } else {
            read_regular_bounded(path, MAX_MANIFEST_BYTES, true)
                .map_err(|e| bad(format!("cannot read: {e}")))
                .and_then(|b| {
                    String::from_utf8(b).map_err(|_| bad("the file is not UTF-8 text".into()))
                })
        };
        let prev = self.files.remove(path);
        let (good_before, pools_before, hash_before) = match &prev {
            Some(p) => (p.good.clone(), p.good_pools.clone(), Some(p.content_hash)),
            None => (Vec::new(), Vec::new(), None),
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                self.files.insert(
                    path.to_path_buf(),
                    FileState {
                        stamp: Stamp {
                            file: stamp_file,
                            creds: Vec::new(),
                        },
                        content_hash: hash_before.unwrap_or_default(),
                        good: good_before,
                        good_pools: pools_before,
                        errors: vec![e],
                    },
                );
                return;
            }
        };
        let content_hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        let (proxies, pools, errors) = parse_file_with_pools(path, &text, &self.dir);
        let creds = proxies
            .iter()
            .filter_map(|p| p.spec.proxy.credentials_ref.as_ref())
            .chain(
                pools
                    .iter()
                    .filter_map(|p| p.spec.template.spec.proxy.credentials_ref.as_ref()),
            )
            .chain(
                pools
                    .iter()
                    .flat_map(|p| p.spec.gateway.iter().flat_map(|g| &g.client_credentials)),
            )
            .map(|r| {
                let cp = self.dir.join(r);
                let (m, s) = file_stamp(&cp);
                (cp, m, s)
            })
            .collect();
        let good_pools = if errors.is_empty() {
            pools.into_iter().map(Arc::new).collect()
        } else {
            pools_before
        };
        let good = if errors.is_empty() {
            // NB: not `into_iter().map(Arc::new).collect()`: that collects in place, and each
            // file's list of 8-byte `Arc`s would keep the parse's buffer of whole
            // `LoadedProxy`s (room for four, ~1.7 KiB) for as long as the file is unchanged:
            // 17 MiB of the peak at 10,000 one-proxy files.
            let mut good = Vec::with_capacity(proxies.len());
            good.extend(proxies.into_iter().map(Arc::new));
            good
        } else {
            // NB: a file with any bad document keeps its previous good version whole; taking
            // its good documents alone would delete the proxy whose document just broke.
            good_before
        };
        self.files.insert(
            path.to_path_buf(),
            FileState {
                stamp: Stamp {
                    file: stamp_file,
                    creds,
                },
                content_hash,
                good,
                good_pools,
                errors,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    const P1: &str = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p1\n\
spec:\n  provider: local\n  image: tiny\n  proxy:\n    allowedClientCidrs: [10.0.0.0/8]\n";

    fn manifest(name: &str, port: u16) -> String {
        format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
             spec:\n  provider: local\n  image: tiny\n  proxy:\n    port: {port}\n    \
             allowedClientCidrs: [10.0.0.0/8]\n"
        )
    }

    #[test]
    fn uids_are_stable_v5_uuids_of_namespace_and_name() {
        let a = uid_for("default", "p1");
        assert_eq!(a, uid_for("default", "p1"));
        assert_ne!(a, uid_for("default", "p2"));
        assert_ne!(a, uid_for("other", "p1"));
        assert_eq!(a.0.get_version_num(), 5);
        // Pinned: changing the namespace UUID would orphan every instance.
        assert_eq!(
            a.canonical(),
            Uuid::new_v5(&UID_NAMESPACE, b"default/p1")
                .hyphenated()
                .to_string()
        );
        assert!(ProxyUid::parse_strict(&a.canonical()).is_some());
    }

    #[test]
    fn several_documents_parse_and_errors_name_the_document_and_field() {
        let text = format!(
            "---\n{P1}---\n{}---\n# only a comment\n---\n{}",
            manifest("p2", 0),
            manifest("p3", 8080)
        );
        let (ok, errs) = parse_file(Path::new("/d/a.yaml"), &text, Path::new("/d"));
        let names: Vec<_> = ok.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["p1", "p3"]);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].document, Some(1));
        assert_eq!(errs[0].path, "spec.proxy.port");
        assert_eq!(
            errs[0].to_string().split(':').take(2).collect::<Vec<_>>(),
            ["/d/a.yaml document 1", " spec.proxy.port"]
        );
    }

    #[test]
    fn a_type_error_is_reported_with_its_field_path_alongside_every_other_error() {
        let doc = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: a/b\n\
                   spec:\n  provider: home\n  image: debian-12\n  resources: {diskGiB: -1}\n  \
                   proxy:\n    port: 0\n    allowedClientCidrs: [10.0.0.0/8]\n";
        let (ok, errs) = parse_file(Path::new("/d/a.yaml"), doc, Path::new("/d"));
        assert!(ok.is_empty());
        let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["spec.resources.diskGiB", "metadata.name", "spec.proxy.port"],
            "{errs:?}"
        );
        assert!(errs[0].message.contains("-1"), "{}", errs[0]);
        for e in &errs {
            let shown = e.to_string();
            assert!(shown.starts_with("/d/a.yaml document 0: "), "{shown}");
            assert!(!shown.contains("<input>"), "{shown}");
        }
        // A syntax error is reported alone, naming the file, not `<input>`.
        let (_, errs) = parse_file(Path::new("/d/b.yaml"), "kind: [unclosed\n", Path::new("/d"));
        assert_eq!(errs.len(), 1);
        let shown = errs[0].to_string();
        assert!(shown.starts_with("/d/b.yaml document 0: "), "{shown}");
        assert!(!shown.contains("<input>"), "{shown}");
    }

    #[test]
    fn a_shape_error_names_the_file_and_document() {
        let text = format!("{P1}---\nkind: Proxy\nbogus: 1\n");
        let (ok, errs) = parse_file(Path::new("/d/a.yaml"), &text, Path::new("/d"));
        assert_eq!(ok.len(), 1);
        // The unknown field and every missing one, each with its path.
        let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths[0], "bogus", "{errs:?}");
        assert!(
            paths.contains(&"metadata") && paths.contains(&"spec"),
            "{errs:?}"
        );
        for e in &errs {
            assert!(e.to_string().starts_with("/d/a.yaml document 1: "), "{e}");
        }
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_proxies_and_a_removed_file_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        std::fs::write(&f, format!("{P1}---\n{}", manifest("p2", 3128))).unwrap();
        let mut store = ManifestStore::new(dir.path());
        let d = store.scan();
        assert_eq!(d.proxies.len(), 2);
        assert!(d.errors.is_empty());
        // Break one document: both proxies stay, the error is reported.
        std::fs::write(&f, format!("{P1}---\n{}", manifest("p2", 0))).unwrap();
        let d = store.scan();
        assert_eq!(d.proxies.len(), 2, "nothing lost on bad input");
        assert_eq!(d.errors.len(), 1);
        // Garbage: still both.
        std::fs::write(&f, "::: not yaml {").unwrap();
        assert_eq!(store.scan().proxies.len(), 2);
        std::fs::remove_file(&f).unwrap();
        let d = store.scan();
        assert!(d.proxies.is_empty());
        assert!(d.errors.is_empty());
    }

    #[test]
    fn a_files_proxies_are_kept_without_the_buffer_they_were_parsed_into() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("p1", 3128)).unwrap();
        let mut store = ManifestStore::new(dir.path());
        assert_eq!(store.scan().proxies.len(), 1);
        let good = &store.files.values().next().unwrap().good;
        // A list collected in place would keep the parse's room for four whole proxies.
        assert_eq!((good.len(), good.capacity()), (1, 1));
    }

    #[test]
    fn a_scan_that_finds_no_change_hands_back_the_same_set_marked_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        std::fs::write(&f, manifest("p1", 3128)).unwrap();
        std::fs::write(dir.path().join("b.yaml"), manifest("p2", 3128)).unwrap();
        let mut store = ManifestStore::new(dir.path());
        let first = store.scan();
        assert!(!first.unchanged, "the first scan is new");
        let again = store.scan();
        assert!(again.unchanged && again.directory_ok);
        assert!(Arc::ptr_eq(&first.proxies, &again.proxies), "no copy");
        // A removed file is a change.
        std::fs::remove_file(&f).unwrap();
        let d = store.scan();
        assert!(!d.unchanged);
        assert_eq!(d.proxies.len(), 1);
        // A directory that cannot be listed, then can again: the set is rebuilt.
        let moved = dir.path().with_extension("moved");
        std::fs::rename(dir.path(), &moved).unwrap();
        let d = store.scan();
        assert!(!d.directory_ok && !d.unchanged);
        std::fs::rename(&moved, dir.path()).unwrap();
        let d = store.scan();
        assert!(d.directory_ok && !d.unchanged);
        assert_eq!(d.proxies.len(), 1);
        assert!(store.scan().unchanged);
    }

    #[test]
    fn a_directory_over_the_file_limit_is_refused_whole_and_nothing_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..3 {
            std::fs::write(
                dir.path().join(format!("p{n}.yaml")),
                manifest(&format!("p{n}"), 3128),
            )
            .unwrap();
        }
        let mut store = ManifestStore::new(dir.path());
        store.max_files = 3;
        assert_eq!(store.scan().proxies.len(), 3);
        std::fs::write(dir.path().join("p3.yaml"), manifest("p3", 3128)).unwrap();
        let d = store.scan();
        assert!(!d.directory_ok, "a partial listing would drop proxies");
        assert_eq!(d.proxies.len(), 3, "the previous set stays");
        assert!(
            d.errors[0].contains("more than 3 manifest files"),
            "{:?}",
            d.errors
        );
    }

    #[test]
    fn the_generation_is_bumped_only_when_the_spec_changes() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.yaml");
        std::fs::write(&f, manifest("p1", 3128)).unwrap();
        let mut store = ManifestStore::new(dir.path());
        let u = uid_for("default", "p1");
        assert_eq!(store.scan().proxies[&u].1, 1);
        // Same spec, different comment/content: same generation.
        std::fs::write(&f, format!("# hello\n{}", manifest("p1", 3128))).unwrap();
        assert_eq!(store.scan().proxies[&u].1, 1);
        std::fs::write(&f, manifest("p1", 8080)).unwrap();
        assert_eq!(store.scan().proxies[&u].1, 2);
    }

    #[test]
    fn duplicates_are_reported_and_the_first_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("p1", 1000)).unwrap();
        std::fs::write(dir.path().join("b.yml"), manifest("p1", 2000)).unwrap();
        std::fs::write(dir.path().join("c.txt"), "ignored").unwrap();
        let d = ManifestStore::new(dir.path()).scan();
        assert_eq!(d.proxies.len(), 1);
        let (p, _) = d.proxies.values().next().unwrap();
        assert_eq!(p.spec.proxy.port, 1000);
        assert_eq!(d.errors.len(), 1);
        assert!(
            d.errors[0].contains("duplicate Proxy default/p1"),
            "{:?}",
            d.errors
        );
    }

    #[test]
    fn credentials_are_read_relative_to_the_directory_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("creds"), "alice:s3cret-pw\n").unwrap();
        let m = "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p1\n\
                 spec:\n  provider: local\n  image: tiny\n  proxy:\n    credentialsRef: creds\n";
        std::fs::write(dir.path().join("a.yaml"), m).unwrap();
        let mut store = ManifestStore::new(dir.path());
        let d = store.scan();
        let (p, g) = d.proxies.values().next().unwrap();
        let c = p.credentials.as_ref().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "s3cret-pw")
        );
        assert!(!format!("{p:?}").contains("s3cret"));
        assert_eq!(*g, 1);
        // A password change bumps the generation even though the manifest is unchanged.
        std::fs::write(dir.path().join("creds"), "alice:another-longer-pw\n").unwrap();
        let d = store.scan();
        assert_eq!(d.proxies.values().next().unwrap().1, 2);
        // A broken credentials file is an error naming the field, not the content.
        std::fs::write(dir.path().join("creds"), "no-colon-here-secret\n").unwrap();
        let d = store.scan();
        assert_eq!(d.proxies.len(), 1, "last good version kept");
        assert!(d.errors[0].contains("spec.proxy.credentialsRef"));
        assert!(!d.errors[0].contains("no-colon-here-secret"));
    }

    /// A manifest in `dir` naming `credentials_ref`, scanned on a thread that must finish
    /// within 10 s (a blocking open or an unbounded read fails the test instead of hanging it).
    fn scan_with_ref(dir: &Path, credentials_ref: &str) -> Desired {
        let m = format!(
            "apiVersion: egress-proxies.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: p1\n\
             spec:\n  provider: local\n  image: tiny\n  proxy:\n    credentialsRef: \
             {credentials_ref:?}\n"
        );
        std::fs::write(dir.join("a.yaml"), m).unwrap();
        let dir = dir.to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(ManifestStore::new(dir).scan());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the scan must not block")
    }

    fn refused(d: &Desired, needle: &str) {
        assert!(d.proxies.is_empty(), "{:?}", d.errors);
        assert_eq!(d.errors.len(), 1, "{:?}", d.errors);
        assert!(
            d.errors[0].contains("spec.proxy.credentialsRef") && d.errors[0].contains(needle),
            "{needle:?} in {:?}",
            d.errors
        );
    }

    #[test]
    fn a_credentials_file_outside_the_manifest_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("manifests");
        std::fs::create_dir(&dir).unwrap();
        let outside = root.path().join("secret");
        std::fs::write(&outside, "root:outside-the-directory-pw\n").unwrap();
        refused(
            &scan_with_ref(&dir, outside.to_str().unwrap()),
            "absolute path",
        );
        refused(
            &scan_with_ref(&dir, "../secret"),
            "leaves the manifest directory",
        );
        refused(&scan_with_ref(&dir, "sub/../../secret"), "leaves");
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        refused(
            &scan_with_ref(&dir, "link"),
            "outside the manifest directory",
        );
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero")).unwrap();
        refused(
            &scan_with_ref(&dir, "zero"),
            "outside the manifest directory",
        );
        // A link that stays inside (a Secret volume's `..data` farm) is followed.
        std::fs::create_dir(dir.join("..data")).unwrap();
        std::fs::write(dir.join("..data/creds"), "alice:inside-the-directory-pw\n").unwrap();
        std::os::unix::fs::symlink("..data/creds", dir.join("creds")).unwrap();
        let d = scan_with_ref(&dir, "creds");
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        let (p, _) = d.proxies.values().next().unwrap();
        assert_eq!(
            p.credentials.as_ref().unwrap().password,
            "inside-the-directory-pw"
        );
        assert!(
            !d.errors
                .iter()
                .any(|e| e.contains("outside-the-directory-pw"))
        );
    }

    #[test]
    fn a_fifo_or_an_oversized_credentials_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        // No writer ever opens it: a blocking open or read would hang the scan.
        refused(&scan_with_ref(dir.path(), "fifo"), "not a regular file");
        std::fs::create_dir(dir.path().join("d")).unwrap();
        refused(&scan_with_ref(dir.path(), "d"), "not a regular file");
        let big = format!("alice:{}\n", "x".repeat(MAX_CREDENTIALS_BYTES as usize));
        std::fs::write(dir.path().join("big"), big).unwrap();
        refused(&scan_with_ref(dir.path(), "big"), "at most 4096");
    }

    #[test]
    fn the_bounded_reader_refuses_devices_and_stops_at_its_limit() {
        let e = read_regular_bounded(Path::new("/dev/zero"), 16, true).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, [b'a'; 17]).unwrap();
        assert!(read_regular_bounded(&p, 16, true).is_err());
        assert_eq!(read_regular_bounded(&p, 17, true).unwrap().len(), 17);
        // Without following links, a link in the file's place is refused.
        std::os::unix::fs::symlink(&p, dir.path().join("l")).unwrap();
        assert!(read_regular_bounded(&dir.path().join("l"), 17, false).is_err());
        assert!(read_regular_bounded(&dir.path().join("l"), 17, true).is_ok());
    }

    #[test]
    fn a_fifo_named_like_a_manifest_never_blocks_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), P1).unwrap();
        let st = std::process::Command::new("mkfifo")
            .arg(dir.path().join("b.yaml"))
            .status()
            .unwrap();
        assert!(st.success());
        let d2 = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(ManifestStore::new(d2).scan());
        });
        let d = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the scan must not block");
        assert_eq!(d.proxies.len(), 1, "{:?}", d.errors);
    }
}
