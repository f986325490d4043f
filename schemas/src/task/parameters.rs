//! A task's parameters as one group: a struct of its own, declared once,
//! that knows the tasks it applies to. `Parameters` (`job.rs`) holds the
//! groups and reads and writes them as the wire's one flat object.

use serde::Serialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

use super::kind::Task;

/// One task's (or tasks') parameters.
pub trait ParameterGroup: Serialize + DeserializeOwned + Default + PartialEq {
    /// The tasks these parameters apply to.
    const TASKS: &'static [Task];

    /// Refuses values without meaning; the message names the parameter.
    fn check(&self) -> Result<(), String>;
}

/// The field names serde's derive declares for `T`, in order: what it
/// tells a deserializer it expects (so a group's names are its fields,
/// not a list kept beside them).
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    // The probe always ends in its own error, once it has the names.
    let _ = T::deserialize(FieldProbe(&mut fields));
    fields
}

struct FieldProbe<'a>(&'a mut &'static [&'static str]);

#[derive(Debug)]
struct Probed;

impl std::fmt::Display for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names probed")
    }
}

impl std::error::Error for Probed {}

impl de::Error for Probed {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Probed
    }
}

impl<'de> Deserializer<'de> for FieldProbe<'_> {
    type Error = Probed;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probed> {
        *self.0 = fields;
        Err(Probed)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::task::{EmbedParameters, EncoderParameters, GenerateParameters};

    /// The names are the groups' own fields, in order; every parameter
    /// name belongs to exactly one group.
    #[test]
    fn each_parameter_is_declared_once() {
        assert_eq!(field_names::<EncoderParameters>(), ["truncate"]);
        assert_eq!(
            field_names::<EmbedParameters>(),
            ["normalize", "prompt_name"]
        );
        assert_eq!(
            field_names::<GenerateParameters>(),
            [
                "max_new_tokens",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "response_format",
                "logprobs"
            ]
        );
    }

    /// On the wire the groups are one flat object, and a name no task knows
    /// is refused with serde's list of the known ones.
    #[test]
    fn parameters_are_one_flat_object_on_the_wire() {
        use crate::Parameters;
        let wire = serde_json::json!({"truncate": false, "prompt_name": "q", "seed": 3});
        let p: Parameters = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(p.encoder.truncate, Some(false));
        assert_eq!(p.embed.prompt_name.as_deref(), Some("q"));
        assert_eq!(p.generate.seed, Some(3));
        assert_eq!(serde_json::to_value(&p).unwrap(), wire);
        let err = serde_json::from_value::<Parameters>(serde_json::json!({"truncat": 1}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `truncat`") && err.contains("`logprobs`"),
            "{err}"
        );
        let err = serde_json::from_value::<Parameters>(serde_json::json!({"seed": "x"}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("seed") && err.contains("invalid type"),
            "{err}"
        );
    }
}
