//! Events about Proxies (events.k8s.io/v1), written as kube-runtime's `Recorder` writes them
//! (a new Event per (regarding object, type, reason, action); a repeat within
//! [`SERIES_TTL`] patches that Event's `series` instead of creating another), with a cache
//! whose cost does not grow with the fleet.
//!
//! Why not kube-runtime's `Recorder`: it keeps every Event it wrote for 6 minutes as a whole
//! `Event` object (with its key, ~1 KiB inline per entry of its hash table) and walks the
//! entire cache on every publish to expire old entries. With a few Events per Proxy while a
//! fleet comes up, that table was the largest single item of the operator's heap in the
//! Kubernetes benchmark (~5.9 KB per Proxy), and each publish cost O(Events of the last 6
//! minutes).
//!
//! Guarantees: a publish does O(1) work on the cache, amortized (expiry pops from the front
//! of a queue in insertion order); the cache holds at most [`MAX_SERIES`] entries, each the
//! key's strings, the Event's name and its count (a key forgotten early only means its next
//! repeat starts a new Event instead of extending a series); every API call is bounded by
//! [`super::API_SLACK`]; no lock is held across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use serde_json::json;

use super::{API_SLACK, lock};

/// How long a written Event can still become a series (kube-runtime's recorder: 6 minutes).
pub(super) const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// Most Events remembered for series at once; beyond it the oldest are forgotten first.
// NB: 8,192 entries of ~200 bytes: under 2 MiB whatever the fleet, and far more distinct
// events than a healthy fleet repeats within 6 minutes.
pub(super) const MAX_SERIES: usize = 8192;

/// What makes two Events one series: the object they are about and their type, reason and
/// action (the reporter is this recorder's, the same for all).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// `namespace/name/uid` of the regarding object.
    regarding: Box<str>,
    warning: bool,
    reason: Box<str>,
    action: Box<str>,
}

/// A written Event a repeat extends.
#[derive(Debug)]
struct Written {
    namespace: Box<str>,
    name: Box<str>,
    /// Occurrences so far (1: no series yet).
    count: i32,
    last: Timestamp,
}

/// The series cache: entries by key, and the keys in the order they were (re)queued.
#[derive(Debug, Default)]
struct Cache {
    by_key: HashMap<Arc<Key>, Written>,
    /// Each key once, with the time it was queued; a key whose Event repeated since is queued
    /// again at its last occurrence when it reaches the front.
    order: VecDeque<(Timestamp, Arc<Key>)>,
}

impl Cache {
    /// Forgets entries whose last occurrence is [`SERIES_TTL`] old, and the oldest beyond
    /// [`MAX_SERIES`]. Amortized O(1) per call.
    fn expire(&mut self, now: Timestamp) {
        while let Some((queued, _)) = self.order.front() {
            let over = self.by_key.len() >= MAX_SERIES;
            if !over && *queued + SERIES_TTL > now {
                break;
            }
            let Some((_, key)) = self.order.pop_front() else {
                break;
            };
            match self.by_key.get(&key) {
                Some(w) if !over && w.last + SERIES_TTL > now => {
                    // Repeated since it was queued: queue it again at its last occurrence.
                    let last = w.last;
                    self.order.push_back((last, key));
                }
                _ => {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// The entry to extend for `key`, if any: its namespace, name and the new count.
    fn repeat_of(&self, key: &Key) -> Option<(Box<str>, Box<str>, i32)> {
        self.by_key.get(key).map(|w| {
            (
                w.namespace.clone(),
                w.name.clone(),
                w.count.saturating_add(1),
            )
        })
    }

    fn record(&mut self, key: Key, written: Written) {
        if let Some(w) = self.by_key.get_mut(&key) {
            *w = written;
            return;
        }
        let key = Arc::new(key);
        self.order.push_back((written.last, Arc::clone(&key)));
        self.by_key.insert(key, written);
    }

    fn forget(&mut self, key: &Key) {
        // NB: its queue entry stays until it reaches the front, then finds nothing to remove.
        self.by_key.remove(key);
    }
}

/// Publishes Events as this operator's reporter (see the module doc).
pub(super) struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    cache: Mutex<Cache>,
}

impl Recorder {
    /// A recorder writing as `controller` (`reportingController`) from `instance`
    /// (`reportingInstance`).
    pub(super) fn new(client: Client, controller: String, instance: String) -> Self {
        Self {
            client,
            controller,
            instance,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// Writes `ev` about `regarding` (in its namespace, `default` without one): a new Event,
    /// or a series patch of the Event written for the same key within [`SERIES_TTL`].
    pub(super) async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = key_of(ev, regarding);
        let repeat = {
            let mut c = lock(&self.cache);
            c.expire(now);
            c.repeat_of(&key)
        };
        if let Some((namespace, name, count)) = repeat {
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(now),
            };
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
            let patch = Patch::Merge(json!({ "series": series }));
            let pp = PatchParams::default();
            // rbac: EVENTS patch
            match bounded(api.patch(&name, &pp, &patch)).await {
                Ok(_) => {
                    let written = Written {
                        namespace,
                        name,
                        count,
                        last: now,
                    };
                    lock(&self.cache).record(key, written);
                    return Ok(());
                }
                // Gone from the server (its Event TTL): start a new one below.
                Err(kube::Error::Api(e)) if e.code == 404 => lock(&self.cache).forget(&key),
                Err(e) => return Err(e),
            }
        }
        let event = self.generate(ev, regarding, now);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.metadata.name.clone().unwrap_or_default();
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        // rbac: EVENTS create
        bounded(api.create(&PostParams::default(), &event)).await?;
        let written = Written {
            namespace: namespace.into(),
            name: name.into(),
            count: 1,
            last: now,
        };
        lock(&self.cache).record(key, written);
        Ok(())
    }

    /// The Event kube-runtime's recorder would create for `ev` about `regarding` at `now`.
    fn generate(&self, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: Some(namespace),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            related: ev.secondary.clone(),
            ..K8sEvent::default()
        }
    }

    /// How many Events are remembered for series (tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        lock(&self.cache).by_key.len()
    }
}

fn key_of(ev: &Event, regarding: &ObjectReference) -> Key {
    let s = |o: &Option<String>| o.as_deref().unwrap_or_default().to_owned();
    Key {
        regarding: format!(
            "{}/{}/{}",
            s(&regarding.namespace),
            s(&regarding.name),
            s(&regarding.uid)
        )
        .into(),
        warning: matches!(ev.type_, EventType::Warning),
        reason: ev.reason.as_str().into(),
        action: ev.action.as_str().into(),
    }
}

/// `call`, failing as a timeout after [`API_SLACK`].
async fn bounded<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
    match tokio::time::timeout(API_SLACK, call).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!(
                "the Event write did not finish within {}s",
                API_SLACK.as_secs()
            )
            .into(),
        )),
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
