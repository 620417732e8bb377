//! Python's `str()` and `repr()` of template values.
//!
//! Jinja2 prints values with Python's `str()`: `True`/`False`/`None`, floats
//! as `repr(float)` (`1.0`, `1e-05`, `1e+20`), and lists and dicts as their
//! Python `repr` (`['a', 1]`, `{'k': None}`). minijinja prints `true`,
//! `none` and JSON-like lists, so chat templates that print a value directly
//! would render differently; the environment's formatter and the `string` /
//! `join` filters use these functions instead.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// Python's whitespace (`str.isspace`): Rust's `char::is_whitespace` plus
/// the ASCII information separators U+001C..U+001F.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `str(value)` as Python would print it.
pub(crate) fn py_str(value: &Value) -> String {
    let mut out = String::new();
    write_str(&mut out, value);
    out
}

/// Appends `str(value)` to `out`.
pub(crate) fn write_str(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(out, value),
    }
}

/// `repr(value)` as Python would print it.
#[cfg(test)]
pub(crate) fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

/// Appends `repr(value)` to `out`.
pub(crate) fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Bytes => {
            out.push('b');
            let text: String =
                value.as_bytes().unwrap_or_default().iter().map(|b| *b as char).collect();
            write_str_repr(out, &text);
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let tuple = value.is_tuple();
            out.push(if tuple { '(' } else { '[' });
            let mut n = 0;
            if let Ok(iter) = value.try_iter() {
                for item in iter {
                    if n > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                    n += 1;
                }
            }
            if tuple && n == 1 {
                out.push(',');
            }
            out.push(if tuple { ')' } else { ']' });
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    let item = value.get_item(&key).unwrap_or_default();
                    write_repr(out, &item);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else if let Ok(f) = f64::try_from(value.clone()) {
        write_float(out, f);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, in positional
/// notation when the decimal exponent is in `-4..16`, else scientific with a
/// signed two-digit exponent.
pub(crate) fn write_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("nan");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "inf" } else { "-inf" });
        return;
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e20".
    let sci = format!("{f:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// Python's `repr(str)`: single quotes unless the text holds a single quote
/// and no double quote; escapes for backslash, the quote, control and
/// non-printable characters.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = c as u32;
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else if code < 0x10000 {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An approximation of Python's `str.isprintable` for one character: false
/// for control, format, separator (other than space) and private-use
/// characters.
fn is_printable(c: char) -> bool {
    let code = c as u32;
    if c == ' ' {
        return true;
    }
    if code < 0x20 || (0x7f..=0xa0).contains(&code) {
        return false;
    }
    if c.is_ascii() {
        return true;
    }
    !matches!(code,
        0xad
        | 0x600..=0x605
        | 0x61c
        | 0x6dd
        | 0x70f
        | 0x1680
        | 0x180e
        | 0x2000..=0x200f
        | 0x2028..=0x202f
        | 0x205f..=0x2064
        | 0x2066..=0x206f
        | 0x3000
        | 0xd800..=0xf8ff
        | 0xfeff
        | 0xfff9..=0xfffb
        | 0xfffe..=0xffff
        | 0x110bd
        | 0x1d173..=0x1d17a
        | 0xe0001
        | 0xe0020..=0xe007f
        | 0xf0000..
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(f: f64) -> String {
        let mut s = String::new();
        write_float(&mut s, f);
        s
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(float(1.0), "1.0");
        assert_eq!(float(0.5), "0.5");
        assert_eq!(float(-2.25), "-2.25");
        assert_eq!(float(1e-5), "1e-05");
        assert_eq!(float(0.0001), "0.0001");
        assert_eq!(float(1e16), "1e+16");
        assert_eq!(float(1e15), "1000000000000000.0");
        assert_eq!(float(123456.789), "123456.789");
        assert_eq!(float(1.5e-7), "1.5e-07");
        assert_eq!(float(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(float(f64::INFINITY), "inf");
        assert_eq!(float(0.0), "0.0");
        assert_eq!(float(-0.0), "-0.0");
    }

    #[test]
    fn values_print_like_python() {
        let v = crate::template::map_value([
            ("a".into(), Value::from(true)),
            ("b".into(), Value::from(())),
            ("c".into(), Value::from(vec![Value::from(1), Value::from("x'y")])),
        ]);
        assert_eq!(py_str(&v), r#"{'a': True, 'b': None, 'c': [1, "x'y"]}"#);
        assert_eq!(py_str(&Value::from("plain")), "plain");
        assert_eq!(py_repr(&Value::from("a\nb\\'\"")), r#"'a\nb\\\'"'"#);
        assert_eq!(py_repr(&Value::from("\u{a0}é\u{1}")), r"'\xa0é\x01'");
        assert_eq!(py_str(&Value::from(false)), "False");
        assert_eq!(py_str(&Value::UNDEFINED), "");
    }
}
