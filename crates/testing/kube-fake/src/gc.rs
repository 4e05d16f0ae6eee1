//! Deletion propagation and the garbage collector, as the Kubernetes documentation describes
//! them ("Garbage Collection", "Owners and Dependents", "Use Cascading Deletion") and the
//! garbage collector controller (`pkg/controller/garbagecollector`) does them:
//! - a delete's `propagationPolicy` (or the deprecated `orphanDependents`) decides what happens
//!   to the object: `Background` (the default for every type the fake serves) removes it at once
//!   when it has no finalizers; `Foreground` sets `deletionTimestamp` and the
//!   `foregroundDeletion` finalizer; `Orphan` sets `deletionTimestamp` and the `orphan`
//!   finalizer (an object that already has finalizers only gets `deletionTimestamp`, plus the
//!   policy's finalizer);
//! - the collector then works through the objects that changed, asynchronously (a task of its
//!   own, woken after each write; [`crate::FakeApiServer::set_gc_paused`] holds it, and
//!   [`crate::FakeApiServer::collect_garbage`] runs it to the end at once):
//!   - an object with `ownerReferences` is looked up owner by owner (its type from the
//!     reference's `apiVersion` and `kind`, the dependent's namespace for a namespaced owner, the
//!     name, and the UID must match): when some owner exists and is not being deleted in the
//!     foreground, references to missing owners and to owners deleted in the foreground are
//!     removed and the object stays; when none does, the object is deleted — in the foreground if
//!     an owner waits for it in the foreground and it has dependents of its own, else by its own
//!     finalizers' policy (`orphan`, `foregroundDeletion`) or in the background;
//!   - an owner being deleted with `orphan` has the references to it removed from every
//!     dependent, then loses the finalizer (and is removed when it was the last one);
//!   - an owner being deleted with `foregroundDeletion` has its dependents deleted; it loses the
//!     finalizer once no dependent whose reference to it says `blockOwnerDeletion: true` exists
//!     any more (dependents still being deleted, e.g. held by their own finalizers, still block).
//! - A reference whose type the server does not serve cannot be resolved: the dependent is kept
//!   (the real collector retries it); a cluster-scoped dependent naming a namespaced kind is kept
//!   too (the real collector reports `OwnerRefInvalidNamespace`).
//!
//! Not modelled: the collector's Events, a second delete changing the policy of an object
//! already being deleted, and `blockOwnerDeletion`'s admission check (it needs RBAC).
//!
//! Cost: the indexes (UID → object, owner UID → dependents) are kept up to date by each write,
//! and the collector only visits the objects a write concerned and their dependents, so its
//! work per write does not grow with the number of objects stored.

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde_json::Value;

use crate::{ObjKey, State, has_finalizers, meta_mut, now_rfc3339};

/// The finalizer of a foreground deletion.
pub(crate) const FOREGROUND: &str = "foregroundDeletion";
/// The finalizer of an orphaning deletion.
pub(crate) const ORPHAN: &str = "orphan";
/// Most collector steps per lock acquisition (the lock is released between batches).
// NB: one step is a few map look-ups and at most one write; 256 keep a batch well under a
// millisecond, so requests never wait long behind the collector.
pub(crate) const BATCH: usize = 256;

/// How a delete propagates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    Background,
    Foreground,
    Orphan,
}

impl Policy {
    /// The policy of a `DeleteOptions` body (`propagationPolicy`, else `orphanDependents`),
    /// `Background` when it says nothing.
    pub(crate) fn of(opts: &Value) -> Result<Self, String> {
        match opts.get("propagationPolicy").and_then(Value::as_str) {
            Some("Background") => return Ok(Self::Background),
            Some("Foreground") => return Ok(Self::Foreground),
            Some("Orphan") => return Ok(Self::Orphan),
            Some(other) => {
                return Err(format!(
                    "propagationPolicy: Unsupported value: \"{other}\": supported values: \
                     \"Foreground\", \"Background\", \"Orphan\""
                ));
            }
            None => {}
        }
        Ok(
            match opts.get("orphanDependents").and_then(Value::as_bool) {
                Some(true) => Self::Orphan,
                _ => Self::Background,
            },
        )
    }
}

/// One owner reference, as the collector reads it.
#[derive(Debug, Clone)]
struct OwnerRef {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
    block: bool,
}

fn refs_of(obj: &Value) -> Vec<OwnerRef> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|r| {
                    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                    OwnerRef {
                        api_version: s("apiVersion"),
                        kind: s("kind"),
                        name: s("name"),
                        uid: s("uid"),
                        block: r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true),
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

fn uid_of(obj: &Value) -> String {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
}

/// The collector's indexes and work queue.
#[derive(Debug, Default)]
pub(crate) struct Gc {
    /// UID → object.
    by_uid: HashMap<String, ObjKey>,
    /// Dependent UID → owner UIDs it references.
    owners: HashMap<String, Vec<String>>,
    /// Owner UID → dependent UIDs.
    dependents: HashMap<String, BTreeSet<String>>,
    /// UIDs to look at, and those queued (no duplicates).
    queue: VecDeque<String>,
    queued: BTreeSet<String>,
    /// Objects deleted by the collector (for tests and counters).
    pub deleted: u64,
}

impl Gc {
    fn enqueue(&mut self, uid: &str) {
        if !uid.is_empty() && self.queued.insert(uid.to_owned()) {
            self.queue.push_back(uid.to_owned());
        }
    }

    /// Updates the indexes after a write of `obj` (`event`: ADDED, MODIFIED, DELETED) and
    /// queues what the collector must look at.
    pub(crate) fn observe(&mut self, event: &str, key: ObjKey, obj: &Value) {
        let uid = uid_of(obj);
        if uid.is_empty() {
            return;
        }
        let old_owners = self.owners.remove(&uid).unwrap_or_default();
        for o in &old_owners {
            if let Some(d) = self.dependents.get_mut(o) {
                d.remove(&uid);
                if d.is_empty() {
                    self.dependents.remove(o);
                }
            }
        }
        if event == "DELETED" {
            self.by_uid.remove(&uid);
            // Its dependents may have lost their last owner; its owners may wait for it.
            let deps: Vec<String> = self
                .dependents
                .get(&uid)
                .map(|d| d.iter().cloned().collect())
                .unwrap_or_default();
            for d in deps {
                self.enqueue(&d);
            }
            for o in old_owners {
                self.enqueue(&o);
            }
            return;
        }
        self.by_uid.insert(uid.clone(), key);
        let refs = refs_of(obj);
        let owners: Vec<String> = refs
            .iter()
            .map(|r| r.uid.clone())
            .filter(|u| !u.is_empty())
            .collect();
        for o in &owners {
            self.dependents
                .entry(o.clone())
                .or_default()
                .insert(uid.clone());
        }
        // An owner whose dependents changed may now be free to go.
        for o in old_owners.iter().filter(|o| !owners.contains(o)) {
            self.enqueue(o);
        }
        if !owners.is_empty() {
            self.owners.insert(uid.clone(), owners);
            self.enqueue(&uid);
        }
        if deleting(obj) {
            self.enqueue(&uid);
        }
    }

    /// Whether the collector has work queued.
    pub(crate) fn pending(&self) -> bool {
        !self.queue.is_empty()
    }
}

/// How a reference's owner stands.
#[derive(Debug, PartialEq, Eq)]
enum Owner {
    /// Exists (and is not waiting for its dependents).
    Solid,
    /// Missing (or another object of the same name with another UID).
    Dangling,
    /// Being deleted in the foreground.
    Waiting,
    /// Its type is not served, or a cluster-scoped dependent names a namespaced owner.
    Unresolvable,
}

impl State {
    /// Runs up to `steps` collector steps; returns whether work is left.
    pub(crate) fn gc_steps(&mut self, steps: usize) -> bool {
        for _ in 0..steps {
            let Some(uid) = self.gc.queue.pop_front() else {
                return false;
            };
            self.gc.queued.remove(&uid);
            self.gc_item(&uid);
        }
        self.gc.pending()
    }

    fn gc_item(&mut self, uid: &str) {
        let Some(key) = self.gc.by_uid.get(uid).cloned() else {
            return;
        };
        let Some(obj) = self.objects.get(&key).map(|s| s.object.clone()) else {
            return;
        };
        if deleting(&obj) {
            let fins = finalizers(&obj);
            if fins.iter().any(|f| f == ORPHAN) {
                self.orphan_dependents(uid);
                self.remove_finalizer(&key, ORPHAN);
                return;
            }
            if fins.iter().any(|f| f == FOREGROUND) {
                self.foreground_step(uid, &key);
                // NB: a foreground-deleted object may itself be a dependent; fall through.
            }
        }
        let refs = refs_of(&obj);
        if refs.is_empty() {
            return;
        }
        let classified: Vec<(OwnerRef, Owner)> = refs
            .into_iter()
            .map(|r| {
                let c = self.classify(&r, &key);
                (r, c)
            })
            .collect();
        let solid = classified
            .iter()
            .any(|(_, c)| matches!(c, Owner::Solid | Owner::Unresolvable));
        if solid {
            let drop: BTreeSet<String> = classified
                .iter()
                .filter(|(_, c)| matches!(c, Owner::Dangling | Owner::Waiting))
                .map(|(r, _)| r.uid.clone())
                .collect();
            if !drop.is_empty() {
                self.remove_refs(&key, &drop);
            }
            return;
        }
        if deleting(&obj) && !has_finalizers(&obj) {
            return;
        }
        let waiting = classified.iter().any(|(_, c)| *c == Owner::Waiting);
        let has_dependents = self.gc.dependents.get(uid).is_some_and(|d| !d.is_empty());
        let fins = finalizers(&obj);
        let policy = if waiting && has_dependents {
            Policy::Foreground
        } else if fins.iter().any(|f| f == ORPHAN) {
            Policy::Orphan
        } else if fins.iter().any(|f| f == FOREGROUND) {
            Policy::Foreground
        } else {
            Policy::Background
        };
        if !deleting(&obj) {
            self.gc.deleted = self.gc.deleted.saturating_add(1);
            let _ = self.delete_with(&key, policy);
        }
    }

    fn classify(&self, r: &OwnerRef, dependent: &ObjKey) -> Owner {
        let group = r.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let Some((plural, namespaced)) = self.plural_of(group, &r.kind) else {
            return Owner::Unresolvable;
        };
        if namespaced && dependent.2.is_empty() {
            return Owner::Unresolvable;
        }
        let ns = if namespaced {
            dependent.2.clone()
        } else {
            String::new()
        };
        let key = (group.to_owned(), plural, ns, r.name.clone());
        match self.objects.get(&key) {
            Some(s) if uid_of(&s.object) == r.uid => {
                if deleting(&s.object) && finalizers(&s.object).iter().any(|f| f == FOREGROUND) {
                    Owner::Waiting
                } else {
                    Owner::Solid
                }
            }
            _ => Owner::Dangling,
        }
    }

    /// The plural and scope of a kind: a stored CRD's, or a built-in's.
    fn plural_of(&self, group: &str, kind: &str) -> Option<(String, bool)> {
        self.types
            .values()
            .find(|t| t.group == group && t.kind == kind)
            .map(|t| (t.plural.clone(), t.namespaced))
            .or_else(|| crate::discovery::builtin(group, kind))
    }

    fn orphan_dependents(&mut self, owner: &str) {
        let deps: Vec<String> = self
            .gc
            .dependents
            .get(owner)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        let one = BTreeSet::from([owner.to_owned()]);
        for d in deps {
            if let Some(k) = self.gc.by_uid.get(&d).cloned() {
                self.remove_refs(&k, &one);
            }
        }
    }

    fn foreground_step(&mut self, owner: &str, key: &ObjKey) {
        let deps: Vec<String> = self
            .gc
            .dependents
            .get(owner)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        let mut blocking = false;
        for d in &deps {
            let Some(k) = self.gc.by_uid.get(d).cloned() else {
                continue;
            };
            let Some(dep) = self.objects.get(&k).map(|s| s.object.clone()) else {
                continue;
            };
            if refs_of(&dep).iter().any(|r| r.uid == owner && r.block) {
                blocking = true;
            }
            self.gc.enqueue(d);
        }
        if !blocking {
            self.remove_finalizer(key, FOREGROUND);
        }
    }

    /// A write by the collector: the object with `f` applied, a new resourceVersion, a
    /// MODIFIED event (or DELETED when it removed the last finalizer of an object being
    /// deleted).
    fn gc_write(&mut self, key: &ObjKey, f: impl FnOnce(&mut Value)) {
        let Some(mut stored) = self.objects.get(key).cloned() else {
            return;
        };
        f(&mut stored.object);
        let rv = self.next_rv();
        if let Some(m) = meta_mut(&mut stored.object) {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let out = stored.object.clone();
        if deleting(&out) && !has_finalizers(&out) {
            self.objects.remove(key);
            self.record(&key.0, &key.1, "DELETED", out);
        } else {
            self.objects.insert(key.clone(), stored);
            self.record(&key.0, &key.1, "MODIFIED", out);
        }
    }

    fn remove_refs(&mut self, key: &ObjKey, uids: &BTreeSet<String>) {
        self.gc_write(key, |o| {
            if let Some(m) = meta_mut(o) {
                let kept: Vec<Value> = m
                    .get("ownerReferences")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter(|r| {
                                !r.get("uid")
                                    .and_then(Value::as_str)
                                    .is_some_and(|u| uids.contains(u))
                            })
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if kept.is_empty() {
                    m.remove("ownerReferences");
                } else {
                    m.insert("ownerReferences".into(), Value::Array(kept));
                }
            }
        });
    }

    fn remove_finalizer(&mut self, key: &ObjKey, fin: &str) {
        self.gc_write(key, |o| {
            if let Some(m) = meta_mut(o) {
                let kept: Vec<Value> = m
                    .get("finalizers")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter(|f| f.as_str() != Some(fin))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if kept.is_empty() {
                    m.remove("finalizers");
                } else {
                    m.insert("finalizers".into(), Value::Array(kept));
                }
            }
        });
    }

    /// Deletes the object at `key` with `policy` (the API's delete and the collector's):
    /// returns the object as removed, or `None` when it is being deleted, held by finalizers.
    pub(crate) fn delete_with(&mut self, key: &ObjKey, policy: Policy) -> Option<Value> {
        let mut stored = self.objects.get(key).cloned()?;
        let add = match policy {
            Policy::Background => None,
            Policy::Foreground => Some(FOREGROUND),
            Policy::Orphan => Some(ORPHAN),
        };
        let mut fins = finalizers(&stored.object);
        if deleting(&stored.object) && !fins.is_empty() {
            // NB: an object already being deleted keeps its deletion as it was.
            return None;
        }
        if let Some(f) = add
            && !fins.iter().any(|x| x == f)
        {
            fins.push(f.to_owned());
        }
        let rv = self.next_rv();
        if let Some(m) = meta_mut(&mut stored.object) {
            m.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        if fins.is_empty() {
            let out = stored.object.clone();
            self.objects.remove(key);
            self.record(&key.0, &key.1, "DELETED", out.clone());
            return Some(out);
        }
        if let Some(m) = meta_mut(&mut stored.object) {
            m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
            m.insert(
                "finalizers".into(),
                Value::Array(fins.into_iter().map(Value::String).collect()),
            );
        }
        let out = stored.object.clone();
        self.objects.insert(key.clone(), stored);
        self.record(&key.0, &key.1, "MODIFIED", out);
        None
    }
}
