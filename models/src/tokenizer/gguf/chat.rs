//! A model's chat template, rendered as Hugging Face's `apply_chat_template`
//! renders it: the Jinja source from the GGUF (`tokenizer.chat_template`) or
//! `--chat-template`, through minijinja with Jinja2's block whitespace
//! rules (`trim_blocks`, `lstrip_blocks`), Python's string and dict methods
//! (`minijinja-contrib`'s pycompat), and the variables the HF templates use:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `raise_exception(message)`, `strftime_now(format)`, and `tojson` as
//! Python's `json.dumps` writes it.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, Error, ErrorKind, State, Value, context};
use time::{Date, Weekday};

/// One chat turn: its `role` (system, user or assistant) and its text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// The special tokens' texts a template may print.
#[derive(Debug, Clone, Default)]
pub struct TemplateTokens {
    pub bos: String,
    pub eos: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template does not parse: a bad `--chat-template` or GGUF.
    #[error("the chat template does not compile: {0:#}")]
    Compile(Error),
    /// The template refused the messages (`raise_exception`, say "roles
    /// must alternate").
    #[error("the model's chat template refused the messages: {0}")]
    Refused(String),
    /// Rendering failed otherwise (an undefined value it needed).
    #[error("the chat template failed: {0:#}")]
    Render(Error),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

const NAME: &str = "chat";
/// The render's date, for `strftime_now`.
const TODAY: &str = "__sluice_today";

impl ChatTemplate {
    pub fn new(source: &str) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(ChatTemplateError::Compile)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(ChatTemplateError::Compile)?;
        Ok(ChatTemplate { env })
    }

    /// The conversation `messages` with the assistant's turn opened, as the
    /// template writes it, on `today` (for templates that print the date).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tokens: &TemplateTokens,
        today: Date,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(ChatTemplateError::Render)?;
        let ctx = context! {
            messages => Value::from(Serde(messages)),
            add_generation_prompt => true,
            // As Hugging Face passes them when a request has none: `tools
            // is not none` is false.
            tools => Value::from(()),
            documents => Value::from(()),
            bos_token => tokens.bos.as_str(),
            eos_token => tokens.eos.as_str(),
            __sluice_today => today.to_julian_day(),
        };
        template.render(ctx).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => {
                ChatTemplateError::Refused(e.detail().unwrap_or("no reason given").to_string())
            }
            _ => ChatTemplateError::Render(e),
        })
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Python's `datetime.now().strftime(format)` for the render's date (at
/// midnight): `%d %m %Y %y %b %B %a %A %j %H %M %S %%`.
fn strftime_now(state: &State, format: String) -> Result<String, Error> {
    let day = state
        .lookup(TODAY)
        .and_then(|v| i32::try_from(v).ok())
        .and_then(|d| Date::from_julian_day(d).ok())
        .ok_or_else(|| Error::new(ErrorKind::UndefinedError, "strftime_now has no date"))?;
    Ok(strftime(day, &format))
}

pub(crate) fn strftime(day: Date, format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month = day.month();
        let weekday = day.weekday();
        match chars.next() {
            Some('d') => out.push_str(&format!("{:02}", day.day())),
            Some('m') => out.push_str(&format!("{:02}", u8::from(month))),
            Some('Y') => out.push_str(&day.year().to_string()),
            Some('y') => out.push_str(&format!("{:02}", day.year().rem_euclid(100))),
            Some('b') => out.push_str(&month.to_string()[..3]),
            Some('B') => out.push_str(&month.to_string()),
            Some('a') => out.push_str(&weekday_name(weekday)[..3]),
            Some('A') => out.push_str(weekday_name(weekday)),
            Some('j') => out.push_str(&format!("{:03}", day.ordinal())),
            Some('H' | 'M' | 'S') => out.push_str("00"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn weekday_name(day: Weekday) -> &'static str {
    match day {
        Weekday::Monday => "Monday",
        Weekday::Tuesday => "Tuesday",
        Weekday::Wednesday => "Wednesday",
        Weekday::Thursday => "Thursday",
        Weekday::Friday => "Friday",
        Weekday::Saturday => "Saturday",
        Weekday::Sunday => "Sunday",
    }
}

/// `tojson` as Hugging Face's templates get it: Python's `json.dumps(value,
/// ensure_ascii=False, indent=indent)` (`", "` and `": "` between items
/// when not indented).
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_json(&json, indent, sort_keys, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                write_json(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(key.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        J::Number(n) if n.is_f64() => {
            // Python writes a float with a fraction part.
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 && f.abs() < 1e16 {
                out.push_str(&format!("{f:.1}"));
            } else {
                out.push_str(&n.to_string());
            }
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use time::macros::date;

    fn render(source: &str, messages: &[(&str, &str)]) -> Result<String, ChatTemplateError> {
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|(r, c)| ChatMessage {
                role: r.to_string(),
                content: c.to_string(),
            })
            .collect();
        let tokens = TemplateTokens {
            bos: "<s>".into(),
            eos: "</s>".into(),
        };
        ChatTemplate::new(source)?.render(&messages, &tokens, date!(2026 - 12 - 05))
    }

    /// Jinja2's block whitespace, Python's string methods, the date, the
    /// special tokens, and a refusal's message.
    #[test]
    fn templates_render_as_jinja2_does() {
        let chatml = "{% for m in messages %}\n<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        assert_eq!(
            render(chatml, &[("user", "  hi  ")]).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(
                "{{ bos_token }}{{ strftime_now('%d %b %Y') }}{{ eos_token }}",
                &[]
            )
            .unwrap(),
            "<s>05 Dec 2026</s>"
        );
        let strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with the user') }}{% endif %}ok";
        match render(strict, &[("assistant", "x")]) {
            Err(ChatTemplateError::Refused(m)) => {
                assert_eq!(m, "Conversations must start with the user")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ChatTemplate::new("{% for %}"),
            Err(ChatTemplateError::Compile(_))
        ));
        assert_eq!(
            render("{{ {'a': [1, 2.0, 'é']} | tojson }}", &[]).unwrap(),
            r#"{"a": [1, 2.0, "é"]}"#
        );
        assert_eq!(
            render("{{ [1] | tojson(indent=2) }}", &[]).unwrap(),
            "[\n  1\n]"
        );
    }

    #[test]
    fn strftime_writes_pythons_fields() {
        assert_eq!(
            strftime(date!(2024 - 07 - 26), "%A %a %d %B %b %m %Y %y %j %%"),
            "Friday Fri 26 July Jul 07 2024 24 208 %"
        );
    }
}
