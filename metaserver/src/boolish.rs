//! A yes-or-no setting of the config file, spelled as its flag and environment variable take it
//! (clap's boolish spellings): a TOML boolean, or, as a string in any case, `true`/`false`,
//! `yes`/`no`, `on`/`off`, `1`/`0`, `y`/`n`, `t`/`f`, or the integers 1 and 0.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A config file's yes or no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boolish(pub bool);

/// What a string says, `None` if it is no spelling of yes or no.
fn parse(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" | "y" | "t" => Some(true),
        "false" | "no" | "off" | "0" | "n" | "f" => Some(false),
        _ => None,
    }
}

const EXPECTED: &str = "true or false (also yes/no, on/off, 1/0)";

impl<'de> Deserialize<'de> for Boolish {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Yes;
        impl Visitor<'_> for Yes {
            type Value = Boolish;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Boolish, E> {
                Ok(Boolish(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Boolish, E> {
                match v {
                    0 | 1 => Ok(Boolish(v == 1)),
                    _ => Err(E::invalid_value(de::Unexpected::Signed(v), &EXPECTED)),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Boolish, E> {
                match v {
                    0 | 1 => Ok(Boolish(v == 1)),
                    _ => Err(E::invalid_value(de::Unexpected::Unsigned(v), &EXPECTED)),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Boolish, E> {
                parse(v)
                    .map(Boolish)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &EXPECTED))
            }
        }
        deserializer.deserialize_any(Yes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct File {
        on: Boolish,
    }

    fn read(text: &str) -> Result<bool, String> {
        toml::from_str::<File>(text)
            .map(|f| f.on.0)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_spelling_the_flag_takes_is_taken() {
        for yes in [
            "true", "\"yes\"", "\"ON\"", "\"1\"", "1", "\"y\"", "\"True\"",
        ] {
            assert_eq!(read(&format!("on = {yes}")), Ok(true), "{yes}");
        }
        for no in ["false", "\"no\"", "\"off\"", "\"0\"", "0", "\"F\""] {
            assert_eq!(read(&format!("on = {no}")), Ok(false), "{no}");
        }
    }

    #[test]
    fn other_values_are_refused_naming_the_spellings() {
        for bad in ["\"maybe\"", "2", "\"\"", "1.0"] {
            let e = read(&format!("on = {bad}")).unwrap_err();
            assert!(e.contains("true or false (also yes/no"), "{bad}: {e}");
        }
    }
}
