//! Serde for request objects that must survive a round trip exactly.
//!
//! kvgate forwards client bodies to engines that keep adding their own
//! fields, so a request object here keeps every key it does not model in a
//! public `extra` map and writes it back in place. Known keys sent as `null`
//! come back as `null`, and all keys come back in the order the client sent
//! them.
//!
//! `#[serde(flatten)]` also keeps unknown keys, but it writes the known
//! fields first, drops explicit nulls of optional fields, and buffers the
//! whole object into an intermediate tree before decoding it (costly for a
//! 200 KB prompt). [`wire_object!`] generates instead a streaming
//! `Deserialize` (one pass, known keys matched without allocating) and an
//! order-preserving `Serialize`, from a field list of the form
//! `required name: Type = "key"` or `optional name: Type = "key"` (an
//! `optional` field is an `Option<Type>`; absent and `null` both read as
//! `None`, and the difference is remembered for the way back).
//!
//! Fields set after parsing are written right after the last known field
//! that was read (or first, for an object built in code); a field set to
//! `None` is left out, unless the client had sent it as `null`.

use serde::de::{self, DeserializeSeed, Visitor};
use serde::ser::SerializeMap;
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt;

/// Where one known field sat among the object's keys.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Index of the field in declaration order.
    field: u8,
    /// How many unknown keys came before it.
    extras_before: u32,
    /// The client sent the key with a `null` value.
    was_null: bool,
}

/// The arrangement of known keys among unknown ones, as read from the wire.
///
/// It is presentation, not content: two objects that differ only in key
/// order compare equal.
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyOrder {
    slots: Vec<Slot>,
    seen: u64,
}

impl PartialEq for KeyOrder {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl KeyOrder {
    /// Whether the field at `field` was already read.
    pub(crate) fn has(&self, field: usize) -> bool {
        field < 64 && self.seen & (1u64 << field) != 0
    }

    /// Whether the field at `field` was read as an explicit `null`.
    pub(crate) fn was_null(&self, field: usize) -> bool {
        self.slots.iter().any(|s| usize::from(s.field) == field && s.was_null)
    }

    /// Notes that the field at `field` came after `extras_before` unknown keys.
    pub(crate) fn record(&mut self, field: usize, extras_before: usize, was_null: bool) {
        if field < 64 {
            self.seen |= 1u64 << field;
            self.slots.push(Slot {
                field: field as u8,
                extras_before: u32::try_from(extras_before).unwrap_or(u32::MAX),
                was_null,
            });
        }
    }
}

/// A key read from the wire: one of the known names, or anything else.
pub(crate) enum WireKey {
    Known(usize),
    Extra(String),
}

/// Reads a key and matches it against the known names without allocating.
#[derive(Clone, Copy)]
pub(crate) struct KeySeed(pub(crate) &'static [&'static str]);

impl KeySeed {
    fn lookup(self, key: &str) -> Option<usize> {
        self.0.iter().position(|name| *name == key)
    }
}

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = WireKey;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<WireKey, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = WireKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<WireKey, E> {
        Ok(match self.lookup(key) {
            Some(idx) => WireKey::Known(idx),
            None => WireKey::Extra(key.to_owned()),
        })
    }

    fn visit_string<E: de::Error>(self, key: String) -> Result<WireKey, E> {
        Ok(match self.lookup(&key) {
            Some(idx) => WireKey::Known(idx),
            None => WireKey::Extra(key),
        })
    }
}

/// The wire name of field `idx`, for error messages.
pub(crate) fn name_of(names: &'static [&'static str], idx: usize) -> &'static str {
    names.get(idx).copied().unwrap_or("?")
}

/// Writes the known fields (through `emit`) and the unknown keys of one
/// object in wire order. `emit(map, idx, was_null)` writes field `idx` if it
/// has a value (or `null` when `was_null`) and nothing otherwise.
pub(crate) fn write_ordered<M, F>(
    map: &mut M,
    order: &KeyOrder,
    extra: &Map<String, Value>,
    n_fields: usize,
    mut emit: F,
) -> Result<(), M::Error>
where
    M: SerializeMap,
    F: FnMut(&mut M, usize, bool) -> Result<(), M::Error>,
{
    let mut slots = order.slots.iter().peekable();
    let mut unrecorded_done = false;
    let write_unrecorded = |map: &mut M, emit: &mut F| -> Result<(), M::Error> {
        for idx in 0..n_fields {
            if !order.has(idx) {
                emit(map, idx, false)?;
            }
        }
        Ok(())
    };
    for (i, (key, value)) in extra.iter().enumerate() {
        while let Some(slot) = slots.next_if(|s| s.extras_before as usize <= i) {
            emit(map, usize::from(slot.field), slot.was_null)?;
        }
        if !unrecorded_done && slots.peek().is_none() {
            write_unrecorded(map, &mut emit)?;
            unrecorded_done = true;
        }
        map.serialize_entry(key, value)?;
    }
    for slot in slots {
        emit(map, usize::from(slot.field), slot.was_null)?;
    }
    if !unrecorded_done {
        write_unrecorded(map, &mut emit)?;
    }
    Ok(())
}

/// Writes a required field.
pub(crate) fn emit_required<M: SerializeMap, T: Serialize>(
    map: &mut M,
    key: &'static str,
    value: &T,
    _was_null: bool,
) -> Result<(), M::Error> {
    map.serialize_entry(key, value)
}

/// Writes an optional field: its value, `null` if the client sent `null`,
/// or nothing.
pub(crate) fn emit_optional<M: SerializeMap, T: Serialize>(
    map: &mut M,
    key: &'static str,
    value: &Option<T>,
    was_null: bool,
) -> Result<(), M::Error> {
    match value {
        Some(v) => map.serialize_entry(key, v),
        None if was_null => map.serialize_entry(key, &()),
        None => Ok(()),
    }
}

/// The Rust type of a field of kind `required` or `optional`.
macro_rules! wire_ty {
    (required $ty:ty) => { $ty };
    (optional $ty:ty) => { Option<$ty> };
}
pub(crate) use wire_ty;

/// Reads the value of a known key into its slot.
macro_rules! wire_read {
    (required $ty:ty, $map:ident, $slot:ident, $order:ident, $idx:ident, $n_extra:ident) => {{
        let value: $ty = $map.next_value()?;
        $order.record($idx, $n_extra, false);
        $slot = Some(value);
    }};
    (optional $ty:ty, $map:ident, $slot:ident, $order:ident, $idx:ident, $n_extra:ident) => {{
        let value: Option<$ty> = $map.next_value()?;
        $order.record($idx, $n_extra, value.is_none());
        $slot = value;
    }};
}
pub(crate) use wire_read;

/// Turns a slot into the struct field, failing on a missing required key.
macro_rules! wire_finish {
    (required $slot:ident, $key:literal) => {
        match $slot {
            Some(value) => value,
            None => return Err(serde::de::Error::missing_field($key)),
        }
    };
    (optional $slot:ident, $key:literal) => {
        $slot
    };
}
pub(crate) use wire_finish;

/// Calls the emitter that matches the field kind.
macro_rules! wire_emit {
    (required $map:ident, $key:literal, $value:expr, $was_null:ident) => {
        $crate::wire::emit_required($map, $key, $value, $was_null)
    };
    (optional $map:ident, $key:literal, $value:expr, $was_null:ident) => {
        $crate::wire::emit_optional($map, $key, $value, $was_null)
    };
}
pub(crate) use wire_emit;

/// Declares a request object with typed known fields, a public `extra` map
/// for everything else, and exact round-trip serde. See the module docs.
macro_rules! wire_object {
    (
        $(#[$smeta:meta])*
        pub struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $kind:ident $field:ident : $ty:ty = $key:literal
            ),* $(,)?
        }
    ) => {
        $(#[$smeta])*
        pub struct $name {
            $(
                $(#[$fmeta])*
                pub $field: $crate::wire::wire_ty!($kind $ty),
            )*
            /// Keys this crate does not model, exactly as the client sent
            /// them, in order. They are forwarded verbatim.
            pub extra: serde_json::Map<String, serde_json::Value>,
            order: $crate::wire::KeyOrder,
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $( $field: Default::default(), )*
                    extra: serde_json::Map::new(),
                    order: $crate::wire::KeyOrder::default(),
                }
            }
        }

        const _: () = {
            #[allow(non_camel_case_types, clippy::enum_variant_names)]
            enum Field {
                $( $field, )*
            }
            const NAMES: &[&str] = &[$( $key, )*];
            assert!(NAMES.len() <= 64, "a wire object holds at most 64 known fields");

            impl $name {
                /// Whether the client sent the known key `key` as `null`.
                #[allow(dead_code)]
                pub(crate) fn sent_as_null(&self, key: &str) -> bool {
                    NAMES.iter().position(|name| *name == key).is_some_and(|idx| self.order.was_null(idx))
                }
            }

            impl<'de> serde::Deserialize<'de> for $name {
                fn deserialize<D>(deserializer: D) -> Result<Self, D::Error>
                where
                    D: serde::Deserializer<'de>,
                {
                    struct ObjectVisitor;

                    impl<'de> serde::de::Visitor<'de> for ObjectVisitor {
                        type Value = $name;

                        fn expecting(
                            &self,
                            f: &mut std::fmt::Formatter<'_>,
                        ) -> std::fmt::Result {
                            f.write_str(concat!("a JSON object (", stringify!($name), ")"))
                        }

                        fn visit_map<A>(self, mut map: A) -> Result<$name, A::Error>
                        where
                            A: serde::de::MapAccess<'de>,
                        {
                            $( let mut $field: Option<$ty> = None; )*
                            let mut extra = serde_json::Map::new();
                            let mut order = $crate::wire::KeyOrder::default();
                            while let Some(key) =
                                map.next_key_seed($crate::wire::KeySeed(NAMES))?
                            {
                                match key {
                                    $crate::wire::WireKey::Extra(key) => {
                                        let value: serde_json::Value = map.next_value()?;
                                        extra.insert(key, value);
                                    }
                                    $crate::wire::WireKey::Known(idx) => {
                                        if order.has(idx) {
                                            return Err(serde::de::Error::duplicate_field(
                                                $crate::wire::name_of(NAMES, idx),
                                            ));
                                        }
                                        let n_extra = extra.len();
                                        $(
                                            if idx == Field::$field as usize {
                                                $crate::wire::wire_read!(
                                                    $kind $ty, map, $field, order, idx, n_extra
                                                );
                                                continue;
                                            }
                                        )*
                                    }
                                }
                            }
                            Ok($name {
                                $( $field: $crate::wire::wire_finish!($kind $field, $key), )*
                                extra,
                                order,
                            })
                        }
                    }

                    deserializer.deserialize_map(ObjectVisitor)
                }
            }

            impl serde::Serialize for $name {
                fn serialize<S>(&self, serializer: S) -> Result<S::Ok, S::Error>
                where
                    S: serde::Serializer,
                {
                    use serde::ser::SerializeMap as _;
                    let mut map = serializer.serialize_map(None)?;
                    $crate::wire::write_ordered(
                        &mut map,
                        &self.order,
                        &self.extra,
                        NAMES.len(),
                        |map, idx, was_null| {
                            $(
                                if idx == Field::$field as usize {
                                    return $crate::wire::wire_emit!(
                                        $kind map, $key, &self.$field, was_null
                                    );
                                }
                            )*
                            Ok(())
                        },
                    )?;
                    map.end()
                }
            }
        };
    };
}
pub(crate) use wire_object;
