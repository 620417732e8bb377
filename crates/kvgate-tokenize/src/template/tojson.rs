//! HF's `tojson` filter: Python's `json.dumps` with transformers' defaults.
//!
//! transformers replaces Jinja's `tojson` (which HTML-escapes and sorts keys)
//! with `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`. So: keys in insertion order, `", "` and `": "` as
//! separators (`","` between items once `indent` is set), Python's float
//! repr, and Python's pretty layout for `indent`. The arguments may be given
//! by position in that order or by name.

use std::fmt::Write;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::pyfmt::write_float;

/// The options of one `tojson` call.
#[derive(Debug, Clone)]
struct JsonOptions {
    ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline and `s` per nesting level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// The `tojson` filter.
pub(crate) fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson() takes at most 4 arguments"));
    }
    let mut slots: [Option<Value>; 4] = Default::default();
    for (i, arg) in args.iter().enumerate() {
        slots[i] = Some(arg.clone());
    }
    for name in kwargs.args() {
        let Some(i) = NAMES.iter().position(|n| *n == name) else {
            return Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("tojson() got an unexpected keyword argument '{name}'"),
            ));
        };
        if slots[i].is_some() {
            return Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("tojson() got multiple values for argument '{name}'"),
            ));
        }
        slots[i] = Some(kwargs.get::<Value>(name)?);
    }
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let ensure_ascii = ensure_ascii.is_some_and(|v| v.is_true());
    let sort_keys = sort_keys.is_some_and(|v| v.is_true());
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) if v.is_integer() => {
            let n = i64::try_from(v).unwrap_or(0).clamp(0, 1024) as usize;
            Some(" ".repeat(n))
        }
        Some(v) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson(): indent must be an int or a string, not {}", v.kind()),
            ))
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_owned(),
                    b.as_str().unwrap_or_default().to_owned(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson(): separators must be a pair of strings",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let opts = JsonOptions { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    encode(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

fn newline(out: &mut String, opts: &JsonOptions, level: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn encode(out: &mut String, value: &Value, opts: &JsonOptions, level: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => encode_number(out, value),
        ValueKind::String => encode_str(out, value.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            newline(out, opts, level + 1);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                    newline(out, opts, level + 1);
                }
                encode(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            newline(out, opts, level + 1);
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                    newline(out, opts, level + 1);
                }
                encode_str(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                encode(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push('}');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// Python's conversion of dict keys: strings as they are, numbers, booleans
/// and None through their JSON spelling.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            encode_number(&mut s, key);
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {}", key.kind()),
        )),
    }
}

fn encode_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => out.push_str("NaN"),
        Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
        Ok(f) => write_float(out, f),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// A JSON string as Python's encoder writes it: `ensure_ascii=False`
/// escapes only `"`, `\` and control characters; `ensure_ascii=True` also
/// every non-ASCII character (and DEL), as `\uXXXX` with surrogate pairs.
fn encode_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson_filter);
        env.template_from_str(template).unwrap().render(ctx).unwrap()
    }

    fn sample() -> Value {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"z": 1, "a": [1.0, 2.5, true, null, "é\n\u0001"], "e": {}, "l": []}"#,
        )
        .unwrap();
        crate::template::map_value([("x".into(), crate::template::json_to_value(&json))])
    }

    #[test]
    fn default_layout_is_python() {
        assert_eq!(
            render("{{ x|tojson }}", sample()),
            r#"{"z": 1, "a": [1.0, 2.5, true, null, "é\n\u0001"], "e": {}, "l": []}"#
        );
    }

    #[test]
    fn indent_and_sort_keys() {
        assert_eq!(
            render("{{ x|tojson(indent=2, sort_keys=true) }}", sample()),
            "{\n  \"a\": [\n    1.0,\n    2.5,\n    true,\n    null,\n    \"é\\n\\u0001\"\n  ],\n  \"e\": {},\n  \"l\": [],\n  \"z\": 1\n}"
        );
    }

    #[test]
    fn ensure_ascii_and_separators() {
        assert_eq!(
            render("{{ x.a|tojson(true, separators=(',', ':')) }}", sample()),
            r#"[1.0,2.5,true,null,"\u00e9\n\u0001"]"#
        );
        assert_eq!(
            render("{{ '😀'|tojson(ensure_ascii=true) }}", Value::UNDEFINED),
            r#""\ud83d\ude00""#
        );
    }

    #[test]
    fn undefined_is_not_serializable() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson_filter);
        let err = env
            .template_from_str("{{ nope|tojson }}")
            .unwrap()
            .render(Value::UNDEFINED)
            .unwrap_err();
        assert!(err.to_string().contains("not JSON serializable"));
    }
}
