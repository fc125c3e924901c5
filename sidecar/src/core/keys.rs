//! The keys of a keyed resource: each distinct value of a request attribute (a tenant, an API
//! key) is a resource of its own, `<resource id>/<key>`. [`SafeKey`] makes a value into a key
//! that is safe as part of an id; [`KeyTable`] holds the live keys, at most `max_keys` of them
//! plus two shared keys, and forgets those unused for a while.
//!
//! A value beyond `max_keys` is charged to the shared [`OVERFLOW`] key rather than evicting
//! another: eviction would hand a client that cycles through values a way to reset other keys'
//! state (their debt, their queue) and escape its limit. A request without the attribute (or
//! with an empty one) is charged to the shared [`MISSING`] key. Neither name can come from a
//! value: an encoded value holds only unreserved characters and `%`.

use std::{borrow::Cow, collections::HashMap};

use super::Seconds;

/// The key of requests that lack the attribute or carry it empty.
pub const MISSING: &str = "!missing";
/// The key shared by the values that found the table full.
pub const OVERFLOW: &str = "!overflow";

/// Whether `text` could be a key of a keyed resource: a shared key, or a value's, which holds
/// only unreserved bytes and escapes.
pub fn could_be_key(text: &str) -> bool {
    text == MISSING || text == OVERFLOW || text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b))
}

/// A value made safe as the last part of an id: RFC 3986 unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`) stay, every other byte is `%XX`, so the encoding is one-to-one and
/// holds no control character, space or glob character; and at most the room it was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafeKey<'a>(Cow<'a, str>);

/// A value whose key would not fit in its id: `bytes` long encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLong {
    pub bytes: usize,
}

impl<'a> SafeKey<'a> {
    /// `value` encoded, if it takes at most `room` bytes; borrowed when nothing needs encoding
    /// (the usual case: no allocation on the data path).
    pub fn encode(value: &'a [u8], room: usize) -> Result<SafeKey<'a>, TooLong> {
        let unreserved = |b: &u8| b.is_ascii_alphanumeric() || b"-._~".contains(b);
        let escaped = value.iter().filter(|b| !unreserved(b)).count();
        let bytes = value.len() + 2 * escaped;
        if bytes > room {
            return Err(TooLong { bytes });
        }
        if escaped == 0 {
            return Ok(SafeKey(Cow::Borrowed(std::str::from_utf8(value).expect("unreserved bytes are ASCII"))));
        }
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let mut out = String::with_capacity(bytes);
        for b in value {
            if unreserved(b) {
                out.push(char::from(*b));
            } else {
                out.extend(['%', char::from(HEX[usize::from(b >> 4)]), char::from(HEX[usize::from(b & 15)])]);
            }
        }
        Ok(SafeKey(Cow::Owned(out)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Which key a request is charged to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key<'a> {
    Value(SafeKey<'a>),
    /// No attribute, or an empty one.
    Missing,
}

/// How a lookup placed its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// On a key already live.
    Live,
    /// On a key made for it.
    New,
    /// The table was full: on the shared overflow key.
    Overflow,
}

struct Held<V> {
    value: V,
    last_used: Seconds,
}

/// The live keys of one keyed resource, each with its `V` (the data path's gate), driven by the
/// caller's clock.
pub struct KeyTable<V> {
    max_keys: usize,
    keys: HashMap<Box<str>, Held<V>>,
    /// Keys of values, the shared keys not counted.
    values: usize,
}

impl<V> KeyTable<V> {
    pub fn new(max_keys: usize) -> KeyTable<V> {
        KeyTable { max_keys, keys: HashMap::new(), values: 0 }
    }

    /// A new bound applies to new values; keys above it stay until they go idle.
    pub fn set_max_keys(&mut self, max_keys: usize) {
        self.max_keys = max_keys;
    }

    /// The key `key` is charged to, made with `make(name)` if it is not live; its last use is
    /// `now`.
    pub fn get(&mut self, now: Seconds, key: &Key<'_>, make: impl FnOnce(&str) -> V) -> (V, Placed)
    where
        V: Clone,
    {
        let name = match key {
            Key::Value(k) => k.as_str(),
            Key::Missing => MISSING,
        };
        if let Some(value) = self.used(now, name) {
            return (value, Placed::Live);
        }
        if matches!(key, Key::Value(_)) && self.values >= self.max_keys {
            let value = self.used(now, OVERFLOW).unwrap_or_else(|| self.make(now, OVERFLOW, make));
            return (value, Placed::Overflow);
        }
        if matches!(key, Key::Value(_)) {
            self.values += 1;
        }
        (self.make(now, name, make), Placed::New)
    }

    fn used(&mut self, now: Seconds, name: &str) -> Option<V>
    where
        V: Clone,
    {
        let held = self.keys.get_mut(name)?;
        held.last_used = held.last_used.max(now);
        Some(held.value.clone())
    }

    fn make(&mut self, now: Seconds, name: &str, make: impl FnOnce(&str) -> V) -> V
    where
        V: Clone,
    {
        let value = make(name);
        self.keys.insert(name.into(), Held { value: value.clone(), last_used: now });
        value
    }

    /// The live key `name`, if any (not a use).
    pub fn find(&self, name: &str) -> Option<&V> {
        self.keys.get(name).map(|held| &held.value)
    }

    /// Forgets the keys last used before `now - idle` unless `busy`; returns them.
    pub fn drop_idle(&mut self, now: Seconds, idle: Seconds, busy: impl Fn(&V) -> bool) -> Vec<(Box<str>, V)> {
        let stale: Vec<Box<str>> = self
            .keys
            .iter()
            .filter(|(_, held)| now - held.last_used >= idle && !busy(&held.value))
            .map(|(name, _)| name.clone())
            .collect();
        stale
            .into_iter()
            .filter_map(|name| {
                let held = self.keys.remove(&name)?;
                if !matches!(&*name, MISSING | OVERFLOW) {
                    self.values -= 1;
                }
                Some((name, held.value))
            })
            .collect()
    }

    /// Live keys, the shared ones included.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.keys.iter().map(|(name, held)| (&**name, &held.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Key<'_> {
        Key::Value(SafeKey::encode(value.as_bytes(), 64).unwrap())
    }

    #[test]
    fn values_are_encoded_one_to_one_and_bounded() {
        let encoded = |v: &[u8], room| SafeKey::encode(v, room).map(|k| k.as_str().to_owned());
        assert_eq!(encoded(b"acme-1.eu_x~", 12), Ok("acme-1.eu_x~".into()));
        assert!(matches!(SafeKey::encode(b"acme", 4).unwrap().0, Cow::Borrowed(_)), "nothing to encode: no copy");
        assert_eq!(encoded(b"a/b c*%", 64), Ok("a%2Fb%20c%2A%25".into()));
        assert_eq!(encoded("é\n".as_bytes(), 64), Ok("%C3%A9%0A".into()));
        assert_eq!(encoded(b"%41", 64), Ok("%2541".into()), "an escape in the value is not taken as one");
        assert_eq!(encoded(b"!missing", 64), Ok("%21missing".into()), "no value names a shared key");
        assert_eq!(encoded(b"abcde", 4), Err(TooLong { bytes: 5 }));
        assert_eq!(encoded(b"ab/", 4), Err(TooLong { bytes: 5 }));
    }

    #[test]
    fn keys_are_made_once_and_shared_keys_are_apart() {
        let mut table = KeyTable::new(2);
        let mut made = Vec::new();
        let mut get = |table: &mut KeyTable<String>, k: Key<'_>| {
            table.get(0.0, &k, |name| {
                made.push(name.to_owned());
                name.to_owned()
            })
        };
        assert_eq!(get(&mut table, key("a")), ("a".into(), Placed::New));
        assert_eq!(get(&mut table, key("a")), ("a".into(), Placed::Live));
        assert_eq!(get(&mut table, Key::Missing), (MISSING.into(), Placed::New));
        assert_eq!(get(&mut table, key("b")), ("b".into(), Placed::New), "the missing key takes no value's room");
        assert_eq!(get(&mut table, key("c")), (OVERFLOW.into(), Placed::Overflow));
        assert_eq!(get(&mut table, key("d")), (OVERFLOW.into(), Placed::Overflow), "one overflow key for all");
        assert_eq!(get(&mut table, key("a")), ("a".into(), Placed::Live), "live keys keep theirs");
        assert_eq!(made, ["a", MISSING, "b", OVERFLOW]);
        assert_eq!(table.len(), 4);
    }

    #[test]
    fn idle_keys_go_and_make_room() {
        let mut table = KeyTable::new(2);
        table.get(0.0, &key("a"), |_| 1);
        table.get(0.0, &key("b"), |_| 2);
        table.get(5.0, &key("c"), |_| 3);
        table.get(8.0, &key("a"), |_| 4);
        assert_eq!(table.find(OVERFLOW), Some(&3));
        // "b" idle since 0; "a" used at 8; the overflow key at 5 but busy.
        let mut dropped = table.drop_idle(10.0, 5.0, |v| *v == 3);
        dropped.sort();
        assert_eq!(dropped, [("b".into(), 2)]);
        assert_eq!(table.get(10.0, &key("c"), |_| 5), (5, Placed::New), "the room b held");
        assert!(table.drop_idle(12.0, 5.0, |_| false).iter().any(|(name, _)| &**name == OVERFLOW));
        assert_eq!(table.len(), 2);
        // A clock that goes back does not make a key younger than its last use.
        table.get(1.0, &key("c"), |_| 6);
        assert_eq!(table.drop_idle(16.0, 5.0, |_| false).len(), 2);
        assert!(table.is_empty());
    }

    #[test]
    fn a_lower_bound_applies_to_new_values() {
        let mut table = KeyTable::new(3);
        for v in ["a", "b", "c"] {
            table.get(0.0, &key(v), |_| ());
        }
        table.set_max_keys(1);
        assert_eq!(table.get(0.0, &key("b"), |_| ()).1, Placed::Live);
        assert_eq!(table.get(0.0, &key("d"), |_| ()).1, Placed::Overflow);
        table.drop_idle(10.0, 1.0, |_| false);
        assert_eq!(table.get(10.0, &key("d"), |_| ()).1, Placed::New);
        assert_eq!(table.get(10.0, &key("e"), |_| ()).1, Placed::Overflow);
    }
}
