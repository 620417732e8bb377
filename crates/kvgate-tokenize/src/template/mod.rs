//! Chat templates: a minijinja environment configured like transformers'
//! `_compile_jinja_template`.
//!
//! transformers renders with Jinja2's `ImmutableSandboxedEnvironment(
//! trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker,
//! loopcontrols])`, the `tojson` filter replaced by `json.dumps`, and the
//! globals `raise_exception` and `strftime_now`. This module builds the
//! minijinja equivalent:
//!
//! - the same whitespace rules (and no trailing newline kept, Jinja's
//!   default);
//! - Python semantics where minijinja's differ: printing (`True`, `None`,
//!   Python `repr` of lists and dicts, see [`pyfmt`]), `str`/`dict` methods
//!   ([`methods`], on top of minijinja-contrib's pycompat), and a few filters
//!   ([`filters`], [`tojson`]);
//! - `{% generation %}...{% endgeneration %}` (transformers'
//!   `AssistantTracker`, which only records offsets) rendered as its body.
//!
//! It also derives what vLLM derives from the source: the content format
//! ([`analysis`]) and the variables the template reads ([`variables`]).
//!
//! Architecture Invariant: a [`ChatTemplate`] is immutable after
//! [`ChatTemplate::compile`] and is shared across threads; rendering takes
//! `&self`.

pub(crate) mod analysis;
#[cfg(test)]
mod compat_tests;
mod filters;
mod methods;
mod pyfmt;
mod tojson;
mod variables;

use std::collections::HashSet;

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind, UndefinedBehavior};

pub use analysis::ContentFormat;
pub(crate) use pyfmt::{is_py_space, py_str};

use crate::error::{Result, TokenizeError};

/// The name of the one template in a [`ChatTemplate`]'s environment.
const NAME: &str = "chat_template";

/// A compiled chat template and what vLLM derives from its source.
#[derive(Debug)]
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// The source as given (before the `generation` tag rewrite).
    source: String,
    /// vLLM's detected content format.
    content_format: ContentFormat,
    /// Whether the source mentions the quoted string "developer".
    mentions_developer: bool,
    /// Jinja2's `find_undeclared_variables` (see [`variables`]): what the
    /// template may read from its context.
    variables: HashSet<String>,
}

impl ChatTemplate {
    /// Compiles a template; syntax errors carry minijinja's message.
    pub(crate) fn compile(source: &str) -> Result<ChatTemplate> {
        let mut env = new_environment();
        let rewritten = rewrite_generation_tags(source);
        let (content_format, variables) = {
            let root = minijinja::machinery::parse(&rewritten, NAME, env.syntax().clone())
                .map_err(|e| TokenizeError::Template(render_error_message(&e)))?;
            (analysis::content_format(&root), variables::undeclared_variables(&root))
        };
        env.add_template_owned(NAME, rewritten)
            .map_err(|e| TokenizeError::Template(render_error_message(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            content_format,
            mentions_developer: analysis::mentions_developer(source),
            variables,
        })
    }

    /// The template source.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// vLLM's detected content format.
    pub(crate) fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Whether the template handles the "developer" role itself.
    pub(crate) fn mentions_developer(&self) -> bool {
        self.mentions_developer
    }

    /// Whether the template reads `name` from its context.
    pub(crate) fn uses_variable(&self, name: &str) -> bool {
        self.variables.contains(name)
    }

    /// Renders with the given context (a map value).
    pub(crate) fn render(&self, context: Value) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizeError::Template(render_error_message(&e)))?;
        template.render(context).map_err(|e| TokenizeError::Template(render_error_message(&e)))
    }
}

/// Whether `source` renders `context` in plain Jinja2 (the environment of
/// [`new_environment`] without transformers' globals `raise_exception` and
/// `strftime_now`): vLLM's probe of whether a template takes system
/// messages after the first (`_detect_merge_inline_system`), which renders
/// in a bare `ImmutableSandboxedEnvironment`, where any template error, a
/// call to an undefined function included, means no.
pub(crate) fn renders_bare(source: &str, context: Value) -> bool {
    let mut env = base_environment();
    // No `{% generation %}` either: that tag is transformers' extension.
    if env.add_template_owned(NAME, source.to_owned()).is_err() {
        return false;
    }
    env.get_template(NAME).and_then(|t| t.render(context)).is_ok()
}

/// The environment shared by all chat templates.
fn new_environment() -> Environment<'static> {
    let mut env = base_environment();
    env.add_function("raise_exception", filters::raise_exception);
    env.add_function("strftime_now", filters::strftime_now);
    env
}

/// Jinja2's environment as transformers configures it, without its globals.
fn base_environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build();
    if let Ok(syntax) = syntax {
        env.set_syntax(syntax);
    }
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_recursion_limit(200);
    env.set_unknown_method_callback(methods::unknown_method);
    env.set_formatter(filters::format_value);
    env.add_filter("tojson", tojson::tojson_filter);
    env.add_filter("string", filters::string_filter);
    env.add_filter("join", filters::join_filter);
    env.add_filter("trim", filters::trim_filter);
    env.add_filter("indent", filters::indent_filter);
    env.add_filter("escape", filters::escape_filter);
    env.add_filter("e", filters::escape_filter);
    env.add_filter("int", filters::int_filter);
    env.add_filter("center", filters::center_filter);
    env.add_filter("wordcount", filters::wordcount_filter);
    env.add_filter("attr", filters::attr_filter);
    env.add_test("sequence", filters::is_sequence);
    env.add_test("callable", filters::is_callable);
    env.add_test("iterable", filters::is_iterable);
    env
}

/// The message of a render error: the text given to `raise_exception`
/// as is, otherwise minijinja's description with its location.
fn render_error_message(err: &minijinja::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<filters::RaisedException>() {
            return raised.0.clone();
        }
        source = e.source();
    }
    match err.kind() {
        ErrorKind::SyntaxError => format!("chat template syntax error: {err}"),
        _ => format!("chat template error: {err}"),
    }
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (any whitespace
/// control) into `{% with %}` / `{% endwith %}`: like transformers' call
/// block, it renders its body in a scope of its own, and as a block tag it
/// has the same effect on surrounding whitespace.
fn rewrite_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open_ws, body) = match inner.chars().next() {
            Some(c @ ('-' | '+')) => (Some(c), &inner[1..]),
            _ => (None, inner),
        };
        let (body, close_ws) = match body.chars().last() {
            Some(c @ ('-' | '+')) => (&body[..body.len() - 1], Some(c)),
            _ => (body, None),
        };
        let replacement = match body.trim() {
            "generation" => Some("with"),
            "endgeneration" => Some("endwith"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str("{%");
                out.extend(open_ws);
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                out.extend(close_ws);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A template map value with keys in the given order.
pub(crate) fn map_value(entries: impl IntoIterator<Item = (Value, Value)>) -> Value {
    Value::from(entries.into_iter().collect::<indexmap::IndexMap<Value, Value>>())
}

/// Converts a JSON value into a template value, keeping key order.
pub(crate) fn json_to_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => items.iter().map(json_to_value).collect(),
        serde_json::Value::Object(map) => {
            map_value(map.iter().map(|(k, v)| (Value::from(k.as_str()), json_to_value(v))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, ctx: serde_json::Value) -> Result<String> {
        ChatTemplate::compile(template)?.render(json_to_value(&ctx))
    }

    #[test]
    fn whitespace_follows_hf() {
        let t = "{% for m in messages %}\n  {{ m }}\n{% endfor %}\n";
        assert_eq!(render(t, serde_json::json!({"messages": ["a", "b"]})).unwrap(), "  a\n  b\n");
    }

    #[test]
    fn python_printing() {
        let t = "{{ x }}|{{ y }}|{{ z }}|{{ n }}|{{ f }}|{{ missing }}";
        let ctx = serde_json::json!({"x": true, "y": null, "z": {"a": [1, "b"]}, "n": 3, "f": 2.0});
        assert_eq!(render(t, ctx).unwrap(), "True|None|{'a': [1, 'b']}|3|2.0|");
    }

    #[test]
    fn raise_exception_message_is_kept() {
        let err = render("{{ raise_exception('Roles must alternate') }}", serde_json::json!({}))
            .unwrap_err();
        assert_eq!(err.to_string(), "Roles must alternate");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let t = "{% for m in messages %}\n{% generation %}\n{{ m }}\n{%- endgeneration %}\n{% endfor %}";
        assert_eq!(render(t, serde_json::json!({"messages": ["a", "b"]})).unwrap(), "ab");
        assert_eq!(rewrite_generation_tags("{%- generation -%}"), "{%- with -%}");
        let scoped =
            "{% set x = 1 %}{% generation %}{% set x = 2 %}{{ x }}{% endgeneration %}{{ x }}";
        assert_eq!(render(scoped, serde_json::json!({})).unwrap(), "21");
    }

    #[test]
    fn python_methods_and_loop_controls() {
        let t = "{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}\
                 {{ m.strip().split(' ')[-1] }}{% endfor %}";
        let ctx = serde_json::json!({"messages": [" a b ", "c d\u{1c}", "e"]});
        assert_eq!(render(t, ctx).unwrap(), "bd");
    }

    #[test]
    fn variables_are_found() {
        let t = ChatTemplate::compile(
            "{% if enable_thinking is defined %}{% endif %}{% set x = 1 %}{{ x }}{{ messages }}",
        )
        .unwrap();
        assert!(t.uses_variable("enable_thinking"));
        assert!(t.uses_variable("messages"));
        assert!(!t.uses_variable("x"));
    }

    #[test]
    fn syntax_errors_are_template_errors() {
        assert!(matches!(ChatTemplate::compile("{% for %}"), Err(TokenizeError::Template(_))));
    }
}
