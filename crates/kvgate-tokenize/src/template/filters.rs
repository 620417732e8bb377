//! Jinja2 filters, tests and HF globals whose minijinja versions differ from
//! what transformers' Jinja2 environment does.
//!
//! - `string`, `join`: items through Python's `str()` (`True`, `None`, ...).
//! - `trim`, `indent`: Python whitespace and `splitlines` boundaries, and
//!   Jinja2's argument names (`first`, `blank`).
//! - `escape`/`e`: markupsafe's entities (`&#39;`, `&#34;`).
//! - `sequence` test: true for strings too; `iterable`: false for `None`;
//!   `callable`; as in Jinja2.
//! - `raise_exception(msg)`: fails the render with the template's message.
//! - `strftime_now(fmt)`: the local time through Python-style `strftime`.

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::methods::{py_splitlines, py_strip};
use super::pyfmt::{is_py_space, py_str, write_str};

/// The source error attached to the failure `raise_exception` produces, so
/// that the render error can be told apart and carry the exact message.
#[derive(Debug)]
pub(crate) struct RaisedException(pub String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// `raise_exception(message)`.
pub(crate) fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = py_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// `strftime_now(format)`: `datetime.now().strftime(format)`.
pub(crate) fn strftime_now(format: &str) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write;
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    let now = chrono::Local::now();
    let mut out = String::new();
    write!(out, "{}", now.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(ErrorKind::InvalidOperation, format!("strftime_now: cannot format {format:?}"))
    })?;
    Ok(Value::from(out))
}

/// `value|string`.
pub(crate) fn string_filter(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        value.clone()
    } else {
        Value::from(py_str(value))
    }
}

/// `value|join(d='', attribute=None)`.
pub(crate) fn join_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let (sep, attribute): (Option<&str>, Option<Value>) = from_args(&args)?;
    let sep = match kwargs.get::<Option<&str>>("d")? {
        Some(d) => d,
        None => sep.unwrap_or(""),
    };
    let attribute = kwargs.get::<Option<Value>>("attribute")?.or(attribute);
    kwargs.assert_all_used()?;
    if value.is_undefined() || value.is_none() {
        return Ok(Value::from(""));
    }
    if let Some(s) = value.as_str() {
        // Jinja2 joins the characters of a string.
        let chars: Vec<String> = s.chars().map(String::from).collect();
        return Ok(Value::from(chars.join(sep)));
    }
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        let item = match &attribute {
            Some(attr) => match attr.as_str() {
                Some(path) => get_path(&item, path)?,
                None => item.get_item(attr)?,
            },
            None => item,
        };
        write_str(&mut out, &item);
    }
    Ok(Value::from(out))
}

/// Jinja2's dotted attribute path (`"a.b.0"`).
fn get_path(value: &Value, path: &str) -> Result<Value, Error> {
    let mut current = value.clone();
    for part in path.split('.') {
        current = match part.parse::<usize>() {
            Ok(index) => current.get_item(&Value::from(index))?,
            Err(_) => current.get_attr(part)?,
        };
    }
    Ok(current)
}

/// `value|trim(chars=None)`.
pub(crate) fn trim_filter(value: &Value, chars: Option<&str>) -> Value {
    let s = py_str(value);
    Value::from(py_strip(&s, chars, true, true))
}

/// `value|indent(width=4, first=False, blank=False)` as Jinja2 3.x.
pub(crate) fn indent_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let (width, first, blank): (Option<Value>, Option<bool>, Option<bool>) = from_args(&args)?;
    let width = kwargs.get::<Option<Value>>("width")?.or(width);
    let first = kwargs.get::<Option<bool>>("first")?.or(first).unwrap_or(false);
    let blank = kwargs.get::<Option<bool>>("blank")?.or(blank).unwrap_or(false);
    kwargs.assert_all_used()?;
    let indention = match &width {
        None => "    ".to_owned(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_owned(),
        Some(w) => " ".repeat(usize::try_from(w.clone()).unwrap_or(0).min(1024)),
    };
    let mut s = py_str(value);
    s.push('\n');
    let lines = py_splitlines(&s, false);
    let mut out = String::new();
    if blank {
        out = lines.join(&format!("\n{indention}"));
    } else if let Some((head, rest)) = lines.split_first() {
        out.push_str(head);
        for line in rest {
            out.push('\n');
            if !line.is_empty() {
                out.push_str(&indention);
            }
            out.push_str(line);
        }
    }
    if first {
        out.insert_str(0, &indention);
    }
    Ok(Value::from(out))
}

/// `value|escape` with markupsafe's entities.
pub(crate) fn escape_filter(value: &Value) -> Value {
    if value.is_safe() {
        return value.clone();
    }
    let s = py_str(value);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Value::from_safe_string(out)
}

/// `value|int(default=0, base=10)`: Python's `int()`, then `int(float())`,
/// then the default.
pub(crate) fn int_filter(value: &Value, default: Option<Value>, base: Option<u32>) -> Value {
    let default = default.unwrap_or_else(|| Value::from(0));
    let base = base.unwrap_or(10);
    match value.kind() {
        ValueKind::Number if value.is_integer() => value.clone(),
        ValueKind::Number => f64::try_from(value.clone())
            .ok()
            .filter(|f| f.is_finite())
            .map_or(default, |f| Value::from(f.trunc() as i64)),
        ValueKind::Bool => Value::from(i64::from(value.is_true())),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default().trim_matches(is_py_space).replace('_', "");
            if let Ok(i) = i64::from_str_radix(&s, base) {
                return Value::from(i);
            }
            match s.parse::<f64>() {
                Ok(f)
                    if f.is_finite()
                        && !s.contains(|c: char| {
                            c.is_ascii_alphabetic() && c != 'e' && c != 'E'
                        }) =>
                {
                    Value::from(f.trunc() as i64)
                }
                _ => default,
            }
        }
        _ => default,
    }
}

/// `value|center(width=80)`.
pub(crate) fn center_filter(value: &Value, width: Option<usize>) -> Value {
    let s = py_str(value);
    let width = width.unwrap_or(80).min(1 << 20);
    let len = s.chars().count();
    let pad = width.saturating_sub(len);
    let left = pad / 2 + (pad & width & 1);
    Value::from(format!("{}{s}{}", " ".repeat(left), " ".repeat(pad - left)))
}

/// `value|wordcount`: runs of word characters (`\w+`).
pub(crate) fn wordcount_filter(value: &Value) -> Value {
    let s = py_str(value);
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut count = 0;
    let mut in_word = false;
    for c in s.chars() {
        if is_word(c) && !in_word {
            count += 1;
        }
        in_word = is_word(c);
    }
    Value::from(count)
}

/// `value|attr(name)`: attribute lookup only; a dict's keys are not its
/// attributes in Python.
pub(crate) fn attr_filter(value: &Value, name: &str) -> Value {
    match value.kind() {
        ValueKind::Map | ValueKind::Seq | ValueKind::String => Value::UNDEFINED,
        _ => value.get_attr(name).unwrap_or(Value::UNDEFINED),
    }
}

/// `value is callable`.
pub(crate) fn is_callable(value: &Value) -> bool {
    value.kind() == ValueKind::Plain
}

/// `value is iterable`: Python's `None` is not (minijinja iterates it as
/// empty, Jinja2 does not).
pub(crate) fn is_iterable(value: &Value) -> bool {
    !value.is_none() && value.try_iter().is_ok()
}

/// `value is sequence`: Jinja2 counts strings as sequences.
pub(crate) fn is_sequence(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Seq | ValueKind::String)
}

/// The formatter: `{{ value }}` prints Python's `str(value)`.
pub(crate) fn format_value(
    out: &mut minijinja::Output<'_>,
    _state: &mut State<'_, '_>,
    value: &Value,
) -> Result<(), Error> {
    let result = match value.kind() {
        ValueKind::String => out.write_str(value.as_str().unwrap_or_default()),
        ValueKind::Undefined => Ok(()),
        _ => out.write_str(&py_str(value)),
    };
    result.map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write output"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_exception_carries_the_message() {
        let err = raise_exception(Value::from("roles must alternate")).unwrap_err();
        let raised = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<RaisedException>())
            .unwrap();
        assert_eq!(raised.0, "roles must alternate");
    }

    #[test]
    fn strftime_now_formats() {
        let year = strftime_now("%Y").unwrap();
        assert_eq!(year.as_str().unwrap().len(), 4);
        assert!(strftime_now("%d %B %Y").is_ok());
    }

    #[test]
    fn escape_like_markupsafe() {
        assert_eq!(
            escape_filter(&Value::from("<a href='x'>&\"")).to_string(),
            "&lt;a href=&#39;x&#39;&gt;&amp;&#34;"
        );
    }
}
