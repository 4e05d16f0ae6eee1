//! `Deserialize` for [`ProviderEntry`]: reads `type:` without buffering the entry.
//!
//! NB: serde's internally tagged enums (`#[serde(tag = "type")]`) buffer the whole entry
//! before dispatching, which loses serde-saphyr's positions: an unknown field deep in a host
//! was reported at the entry's first line. Here the entry's map is passed straight to
//! `LibvirtEntry`'s own deserializer, with the `type` key filtered out and checked, so every
//! error keeps the line and column of the offending node.

use std::fmt;

use egress_provider::libvirt::config::LibvirtEntry;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

use super::ProviderEntry;

/// The values `type:` may take.
const TYPES: &[&str] = &["libvirt"];

impl<'de> Deserialize<'de> for ProviderEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = ProviderEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a provider entry (a mapping with `name`, `type` and the type's fields)")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let entry = LibvirtEntry::deserialize(de::value::MapAccessDeserializer::new(TypeFilter {
            inner: map,
            seen_type: false,
        }))?;
        Ok(ProviderEntry::Libvirt(entry))
    }
}

/// A map that hides (and checks) the `type` key from the inner struct's deserializer.
struct TypeFilter<A> {
    inner: A,
    seen_type: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for TypeFilter<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        loop {
            let Some(key) = self.inner.next_key::<String>()? else {
                if !self.seen_type {
                    return Err(de::Error::missing_field("type"));
                }
                return Ok(None);
            };
            if key == "type" {
                let t: String = self.inner.next_value()?;
                if !TYPES.contains(&t.as_str()) {
                    return Err(de::Error::unknown_variant(&t, TYPES));
                }
                self.seen_type = true;
                continue;
            }
            return seed
                .deserialize(de::value::StringDeserializer::<A::Error>::new(key))
                .map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        self.inner.next_value_seed(seed)
    }
}
