//! Python methods on template values (`message.content.strip()`,
//! `text.split('</think>')`, `tool.get('x')`).
//!
//! minijinja-contrib's `pycompat` callback covers most `str`, `dict` and
//! `list` methods. This callback runs first and replaces the ones where
//! pycompat's Rust semantics differ from Python's (whitespace for
//! `strip`/`split`, the line boundaries of `splitlines`), and adds a few
//! it lacks (`rsplit`, `removeprefix`, `partition`, `index`, ...).

use minijinja::value::{from_args, Kwargs, Value};
use minijinja::{Error, ErrorKind, State};

use super::pyfmt::is_py_space;

/// The environment's unknown-method callback.
pub(crate) fn unknown_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        if let Some(result) = string_method(s, method, args)? {
            return Ok(result);
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.strip` family: `chars` None means whitespace.
pub(crate) fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_space(c),
    };
    let mut out = s;
    if left {
        out = out.trim_start_matches(strip);
    }
    if right {
        out = out.trim_end_matches(strip);
    }
    out
}

/// Python's `str.splitlines` line boundaries.
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{b}'
            | '\u{c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Python's `str.splitlines(keepends)`.
pub(crate) fn py_splitlines(s: &str, keepends: bool) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !is_line_break(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' {
            if let Some((j, '\n')) = chars.peek().copied() {
                chars.next();
                end = j + 1;
            }
        }
        lines.push(if keepends { &s[start..end] } else { &s[start..i] });
        start = end;
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// Python's `str.split(None, maxsplit)`: runs of whitespace, no empty parts.
fn split_whitespace(s: &str, maxsplit: i64) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = s.trim_start_matches(is_py_space);
    while !rest.is_empty() {
        if maxsplit >= 0 && parts.len() as i64 >= maxsplit {
            parts.push(rest);
            break;
        }
        let end = rest.find(is_py_space).unwrap_or(rest.len());
        parts.push(&rest[..end]);
        rest = rest[end..].trim_start_matches(is_py_space);
    }
    parts
}

/// Python's `str.rsplit(None, maxsplit)`.
fn rsplit_whitespace(s: &str, maxsplit: i64) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = s.trim_end_matches(is_py_space);
    while !rest.is_empty() {
        if maxsplit >= 0 && parts.len() as i64 >= maxsplit {
            parts.push(rest);
            break;
        }
        let start = rest
            .rfind(is_py_space)
            .map_or(0, |i| i + rest[i..].chars().next().map_or(1, char::len_utf8));
        parts.push(&rest[start..]);
        rest = rest[..start].trim_end_matches(is_py_space);
    }
    parts.reverse();
    parts
}

fn strs(parts: Vec<&str>) -> Value {
    parts.into_iter().map(Value::from).collect()
}

/// `(sep, maxsplit)` from positional or keyword arguments.
fn split_args(args: &[Value]) -> Result<(Option<String>, i64), Error> {
    let (sep, maxsplit, kwargs): (Option<Value>, Option<i64>, Kwargs) = from_args(args)?;
    let sep = match kwargs.get::<Option<Value>>("sep")? {
        Some(v) => Some(v),
        None => sep,
    };
    let maxsplit = kwargs.get::<Option<i64>>("maxsplit")?.or(maxsplit).unwrap_or(-1);
    kwargs.assert_all_used()?;
    let sep = match sep {
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some("") => return Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
            Some(s) => Some(s.to_owned()),
            None => return Err(Error::new(ErrorKind::InvalidOperation, "must be str or None")),
        },
        None => None,
    };
    Ok((sep, maxsplit))
}

/// Python's char index of a byte offset.
fn char_index(s: &str, byte: usize) -> i64 {
    s[..byte].chars().count() as i64
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let value = match method {
        "strip" | "lstrip" | "rstrip" => {
            let (chars,): (Option<Value>,) = from_args(args)?;
            let chars = chars.filter(|c| !c.is_none());
            let chars = match &chars {
                Some(c) => Some(c.as_str().ok_or_else(|| {
                    Error::new(ErrorKind::InvalidOperation, "strip arg must be None or str")
                })?),
                None => None,
            };
            let (left, right) = match method {
                "lstrip" => (true, false),
                "rstrip" => (false, true),
                _ => (true, true),
            };
            Value::from(py_strip(s, chars, left, right))
        }
        "split" => {
            let (sep, maxsplit) = split_args(args)?;
            match sep {
                None => strs(split_whitespace(s, maxsplit)),
                Some(sep) if maxsplit < 0 => strs(s.split(sep.as_str()).collect()),
                Some(sep) => strs(s.splitn(maxsplit as usize + 1, sep.as_str()).collect()),
            }
        }
        "rsplit" => {
            let (sep, maxsplit) = split_args(args)?;
            match sep {
                None => strs(rsplit_whitespace(s, maxsplit)),
                Some(sep) if maxsplit < 0 => strs(s.split(sep.as_str()).collect()),
                Some(sep) => {
                    let mut parts: Vec<&str> =
                        s.rsplitn(maxsplit as usize + 1, sep.as_str()).collect();
                    parts.reverse();
                    strs(parts)
                }
            }
        }
        "splitlines" => {
            let (keepends,): (Option<bool>,) = from_args(args)?;
            strs(py_splitlines(s, keepends.unwrap_or(false)))
        }
        "removeprefix" => {
            let (prefix,): (&str,) = from_args(args)?;
            Value::from(s.strip_prefix(prefix).unwrap_or(s))
        }
        "removesuffix" => {
            let (suffix,): (&str,) = from_args(args)?;
            Value::from(s.strip_suffix(suffix).unwrap_or(s))
        }
        "partition" | "rpartition" => {
            let (sep,): (&str,) = from_args(args)?;
            if sep.is_empty() {
                return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
            }
            let found = if method == "partition" { s.find(sep) } else { s.rfind(sep) };
            let parts = match found {
                Some(i) => [&s[..i], sep, &s[i + sep.len()..]],
                None if method == "partition" => [s, "", ""],
                None => ["", "", s],
            };
            Value::from(minijinja::value::Tuple::from(parts.map(Value::from)))
        }
        "index" | "rindex" => {
            let (sub,): (&str,) = from_args(args)?;
            let found = if method == "index" { s.find(sub) } else { s.rfind(sub) };
            match found {
                Some(i) => Value::from(char_index(s, i)),
                None => return Err(Error::new(ErrorKind::InvalidOperation, "substring not found")),
            }
        }
        "ljust" | "rjust" | "center" => {
            let (width, fill): (usize, Option<&str>) = from_args(args)?;
            let fill = fill.unwrap_or(" ");
            let mut fill_chars = fill.chars();
            let (Some(fill), None) = (fill_chars.next(), fill_chars.next()) else {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "the fill character must be exactly one character long",
                ));
            };
            let len = s.chars().count();
            let pad = width.saturating_sub(len).min(1 << 20);
            let (left, right) = match method {
                "ljust" => (0, pad),
                "rjust" => (pad, 0),
                // Python centers with the extra character on the left when
                // both the padding and the width are odd.
                _ => {
                    let left = pad / 2 + (pad & width & 1);
                    (left, pad - left)
                }
            };
            let mut out = String::with_capacity(s.len() + pad);
            out.extend(std::iter::repeat_n(fill, left));
            out.push_str(s);
            out.extend(std::iter::repeat_n(fill, right));
            Value::from(out)
        }
        "zfill" => {
            let (width,): (usize,) = from_args(args)?;
            let len = s.chars().count();
            if width <= len {
                Value::from(s)
            } else {
                let pad = (width - len).min(1 << 20);
                let (sign, digits) = match s.chars().next() {
                    Some(c @ ('+' | '-')) => (Some(c), &s[1..]),
                    _ => (None, s),
                };
                let mut out = String::with_capacity(width);
                out.extend(sign);
                out.extend(std::iter::repeat_n('0', pad));
                out.push_str(digits);
                Value::from(out)
            }
        }
        "casefold" => {
            let () = from_args(args)?;
            Value::from(s.to_lowercase())
        }
        "swapcase" => {
            let () = from_args(args)?;
            let mut out = String::with_capacity(s.len());
            for c in s.chars() {
                if c.is_uppercase() {
                    out.extend(c.to_lowercase());
                } else if c.is_lowercase() {
                    out.extend(c.to_uppercase());
                } else {
                    out.push(c);
                }
            }
            Value::from(out)
        }
        "isspace" => {
            let () = from_args(args)?;
            Value::from(!s.is_empty() && s.chars().all(is_py_space))
        }
        _ => return Ok(None),
    };
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(s: &str, method: &str, args: &[Value]) -> Value {
        string_method(s, method, args).unwrap().unwrap()
    }

    fn list(v: Value) -> Vec<String> {
        v.try_iter().unwrap().map(|x| x.to_string()).collect()
    }

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(call("\u{1c} a \n", "strip", &[]).as_str(), Some("a"));
        assert_eq!(call("xxaxx", "lstrip", &[Value::from("x")]).as_str(), Some("axx"));
        assert_eq!(call("\n\nabc\n", "rstrip", &[Value::from("\n")]).as_str(), Some("\n\nabc"));
    }

    #[test]
    fn split_like_python() {
        assert_eq!(list(call("  a  b c ", "split", &[])), ["a", "b", "c"]);
        assert_eq!(
            list(call("  a  b c ", "split", &[Value::from(()), Value::from(1)])),
            ["a", "b c "]
        );
        assert_eq!(list(call("a,b,,c", "split", &[Value::from(",")])), ["a", "b", "", "c"]);
        assert_eq!(
            list(call("a,b,c", "rsplit", &[Value::from(","), Value::from(1)])),
            ["a,b", "c"]
        );
        assert_eq!(
            list(call(" a b  c ", "rsplit", &[Value::from(()), Value::from(1)])),
            [" a b", "c"]
        );
        assert!(string_method("a", "split", &[Value::from("")]).is_err());
    }

    #[test]
    fn splitlines_like_python() {
        assert_eq!(py_splitlines("a\r\nb\rc\n\nd\u{2028}", false), ["a", "b", "c", "", "d"]);
        assert_eq!(py_splitlines("a\r\nb\n", true), ["a\r\n", "b\n"]);
        assert!(py_splitlines("", false).is_empty());
    }

    #[test]
    fn misc_methods() {
        assert_eq!(call("abc", "removeprefix", &[Value::from("a")]).as_str(), Some("bc"));
        assert_eq!(call("ab", "center", &[Value::from(5)]).as_str(), Some("  ab "));
        assert_eq!(call("abc", "center", &[Value::from(6)]).as_str(), Some(" abc  "));
        assert_eq!(call("-5", "zfill", &[Value::from(4)]).as_str(), Some("-005"));
        assert_eq!(call("héllo", "index", &[Value::from("l")]).as_i64(), Some(2));
        assert_eq!(
            call("a=b=c", "rpartition", &[Value::from("=")]).to_string(),
            "('a=b', '=', 'c')"
        );
    }
}
