//! JSON bodies that must be objects: serde's derived structs also accept an array of the
//! fields in order, which the API refuses.

use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// Deserializes `T` from a JSON object only.
///
/// serde's derived structs also accept a JSON array of the fields in order; the API does not,
/// so `[1,2,3]` where an object is expected is `invalid_body` like any other wrong type.
#[derive(Debug)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(ObjectVisitor(PhantomData))
            .map(ObjectOnly)
    }
}

/// An optional field that, when given, must be a JSON object: not null, and not an array.
pub(super) fn some_object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    ObjectOnly::<T>::deserialize(deserializer).map(|o| Some(o.0))
}

pub(super) fn objects<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    let items = Vec::<ObjectOnly<T>>::deserialize(deserializer)?;
    Ok(items.into_iter().map(|o| o.0).collect())
}
