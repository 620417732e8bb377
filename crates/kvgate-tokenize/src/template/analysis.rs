//! Static analysis of a chat template, the way vLLM 0.33 does it
//! (`vllm/renderers/hf.py`: `_detect_content_format`,
//! `_detect_developer_role_support`).
//!
//! **Content format.** vLLM walks the Jinja AST: it collects the names bound
//! to `messages` (directly, through `{% set x = messages... %}`, or through
//! namespace attributes), the loop variables of `{% for m in <those> %}`,
//! and then looks for a loop over `m.content` / `m['content']` (also when
//! passed to a macro parameter, or a top-level loop over a variable named
//! `content`). If one exists the template takes OpenAI-style content-part
//! lists ("openai"), otherwise text parts are joined into one string
//! ("string"). Any analysis failure falls back to "string", as in vLLM.
//!
//! This module ports that walk onto minijinja's (unstable) AST, which has the
//! same shape for the nodes involved: `Var` ~ `Name`, `GetAttr` ~ `Getattr`,
//! `GetItem` ~ `Getitem`, `Slice` ~ `Getitem(Slice)`, `Filter`, `Test`,
//! `Set` ~ `Assign`, `ForLoop` ~ `For`, `Macro`, `Call`.

use std::collections::VecDeque;

use minijinja::machinery::ast;

/// How the template wants message content: vLLM's
/// `ChatTemplateContentFormat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Text parts are joined with `"\n"` into one string.
    String,
    /// Content is a list of `{"type": "text", "text": ...}` parts.
    OpenAi,
}

/// vLLM's `_detect_developer_role_support`: the template mentions the
/// quoted string `"developer"` or `'developer'`.
pub(crate) fn mentions_developer(source: &str) -> bool {
    source.contains("\"developer\"") || source.contains("'developer'")
}

/// Detects the content format of a template source ("string" if it does not
/// parse).
#[cfg(test)]
pub(crate) fn detect_content_format(source: &str) -> ContentFormat {
    let syntax = minijinja::syntax::SyntaxConfig::default();
    match minijinja::machinery::parse(source, "<chat template>", syntax) {
        Ok(root) => content_format(&root),
        Err(_) => ContentFormat::String,
    }
}

/// Detects the content format of a parsed template.
pub(crate) fn content_format(root: &ast::Stmt<'_>) -> ContentFormat {
    let mut nodes = Nodes::default();
    nodes.visit_stmt(root, None);
    match nodes.has_content_loop() {
        Some(true) => ContentFormat::OpenAi,
        // `Some(false)`: no such loop; `None`: vLLM's analysis raised.
        _ => ContentFormat::String,
    }
}

/// One `{% for %}` loop: its target, its iterable and whether it lies in a
/// macro body.
struct ForInfo<'a, 'b> {
    target: &'b ast::Expr<'a>,
    iter: &'b ast::Expr<'a>,
    macro_index: Option<usize>,
}

/// The nodes vLLM's analysis looks at, in document order.
#[derive(Default)]
struct Nodes<'a, 'b> {
    fors: Vec<ForInfo<'a, 'b>>,
    sets: Vec<&'b ast::Set<'a>>,
    macros: Vec<&'b ast::Macro<'a>>,
    calls: Vec<&'b ast::Call<'a>>,
}

impl<'a, 'b> Nodes<'a, 'b> {
    fn visit_body(&mut self, body: &'b [ast::Stmt<'a>], macro_index: Option<usize>) {
        for stmt in body {
            self.visit_stmt(stmt, macro_index);
        }
    }

    fn visit_stmt(&mut self, stmt: &'b ast::Stmt<'a>, macro_index: Option<usize>) {
        use ast::Stmt;
        match stmt {
            Stmt::Template(t) => self.visit_body(&t.children, macro_index),
            Stmt::EmitExpr(e) => self.visit_expr(&e.expr),
            Stmt::EmitRaw(_) => {}
            Stmt::ForLoop(f) => {
                self.fors.push(ForInfo { target: &f.target, iter: &f.iter, macro_index });
                self.visit_expr(&f.target);
                self.visit_expr(&f.iter);
                if let Some(filter) = &f.filter_expr {
                    self.visit_expr(filter);
                }
                self.visit_body(&f.body, macro_index);
                self.visit_body(&f.else_body, macro_index);
            }
            Stmt::IfCond(c) => {
                self.visit_expr(&c.expr);
                self.visit_body(&c.true_body, macro_index);
                self.visit_body(&c.false_body, macro_index);
            }
            Stmt::WithBlock(w) => {
                for (target, value) in &w.assignments {
                    self.visit_expr(target);
                    self.visit_expr(value);
                }
                self.visit_body(&w.body, macro_index);
            }
            Stmt::Set(s) => {
                self.sets.push(s);
                self.visit_expr(&s.target);
                self.visit_expr(&s.expr);
            }
            Stmt::SetBlock(s) => {
                if let Some(filter) = &s.filter {
                    self.visit_expr(filter);
                }
                self.visit_body(&s.body, macro_index);
            }
            Stmt::AutoEscape(a) => {
                self.visit_expr(&a.enabled);
                self.visit_body(&a.body, macro_index);
            }
            Stmt::FilterBlock(f) => {
                self.visit_expr(&f.filter);
                self.visit_body(&f.body, macro_index);
            }
            Stmt::Block(b) => self.visit_body(&b.body, macro_index),
            Stmt::Import(i) => {
                self.visit_expr(&i.expr);
                self.visit_expr(&i.name);
            }
            Stmt::FromImport(i) => self.visit_expr(&i.expr),
            Stmt::Extends(e) => self.visit_expr(&e.name),
            Stmt::Include(i) => self.visit_expr(&i.name),
            Stmt::Macro(m) => {
                let index = self.macros.len();
                self.macros.push(m);
                for default in &m.defaults {
                    self.visit_expr(default);
                }
                self.visit_body(&m.body, Some(index));
            }
            Stmt::CallBlock(c) => {
                // Jinja2 has no Macro node for a call block's body.
                self.visit_call(&c.call);
                self.visit_body(&c.macro_decl.body, macro_index);
            }
            Stmt::Continue(_) | Stmt::Break(_) => {}
            Stmt::Do(d) => self.visit_call(&d.call),
        }
    }

    fn visit_call(&mut self, call: &'b ast::Call<'a>) {
        self.calls.push(call);
        self.visit_expr(&call.expr);
        self.visit_args(&call.args);
    }

    fn visit_args(&mut self, args: &'b [ast::CallArg<'a>]) {
        for arg in args {
            match arg {
                ast::CallArg::Pos(e)
                | ast::CallArg::Kwarg(_, e)
                | ast::CallArg::PosSplat(e)
                | ast::CallArg::KwargSplat(e) => self.visit_expr(e),
            }
        }
    }

    fn visit_expr(&mut self, expr: &'b ast::Expr<'a>) {
        use ast::Expr;
        match expr {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::Slice(s) => {
                self.visit_expr(&s.expr);
                for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.visit_expr(part);
                }
            }
            Expr::UnaryOp(u) => self.visit_expr(&u.expr),
            Expr::BinOp(b) => {
                self.visit_expr(&b.left);
                self.visit_expr(&b.right);
            }
            Expr::Compare(c) => {
                self.visit_expr(&c.expr);
                for op in &c.ops {
                    self.visit_expr(&op.expr);
                }
            }
            Expr::IfExpr(i) => {
                self.visit_expr(&i.test_expr);
                self.visit_expr(&i.true_expr);
                if let Some(f) = &i.false_expr {
                    self.visit_expr(f);
                }
            }
            Expr::Filter(f) => {
                if let Some(e) = &f.expr {
                    self.visit_expr(e);
                }
                self.visit_args(&f.args);
            }
            Expr::Test(t) => {
                self.visit_expr(&t.expr);
                self.visit_args(&t.args);
            }
            Expr::GetAttr(g) => self.visit_expr(&g.expr),
            Expr::GetItem(g) => {
                self.visit_expr(&g.expr);
                self.visit_expr(&g.subscript_expr);
            }
            Expr::Call(c) => self.visit_call(c),
            Expr::List(l) => l.items.iter().for_each(|e| self.visit_expr(e)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| self.visit_expr(e)),
            Expr::Map(m) => {
                m.keys.iter().for_each(|e| self.visit_expr(e));
                m.values.iter().for_each(|e| self.visit_expr(e));
            }
        }
    }

    /// vLLM's `_iter_nodes_assign_var_or_elems(root, "messages")`: the
    /// names (and dotted namespace attributes) that hold `messages`.
    fn message_list_names(&self) -> Vec<String> {
        let mut names = vec!["messages".to_owned()];
        let mut queue = VecDeque::from(["messages".to_owned()]);
        while let Some(related) = queue.pop_front() {
            for set in &self.sets {
                let mut found: Vec<String> = Vec::new();
                if let ast::Expr::Var(lhs) = &set.target {
                    if is_var_or_elems_access(&set.expr, &related, None) {
                        found.push(lhs.id.to_owned());
                    }
                    if let ast::Expr::Call(call) = &set.expr {
                        if matches!(&call.expr, ast::Expr::Var(v) if v.id == "namespace") {
                            for arg in &call.args {
                                if let ast::CallArg::Kwarg(key, value) = arg {
                                    if is_var_or_elems_access(value, &related, None) {
                                        found.push(format!("{}.{key}", lhs.id));
                                    }
                                }
                            }
                        }
                    }
                } else if matches!(&set.target, ast::Expr::GetAttr(_))
                    && is_var_or_elems_access(&set.expr, &related, None)
                {
                    if let Some(dotted) = dotted_name(&set.target) {
                        found.push(dotted);
                    }
                }
                for name in found {
                    if name != related && !names.contains(&name) {
                        names.push(name.clone());
                        queue.push_back(name);
                    }
                }
            }
        }
        names
    }

    /// The loop variables of loops over a message list; `None` when one of
    /// them unpacks (vLLM asserts a plain name there).
    fn message_item_names(&self) -> Option<Vec<String>> {
        let lists = self.message_list_names();
        let mut names = Vec::new();
        for info in &self.fors {
            if lists.iter().any(|l| is_var_or_elems_access(info.iter, l, None)) {
                match info.target {
                    ast::Expr::Var(v) => names.push(v.id.to_owned()),
                    _ => return None,
                }
            }
        }
        Some(names)
    }

    /// vLLM's `_iter_nodes_assign_content_item` has a match.
    fn has_content_loop(&self) -> Option<bool> {
        let items = self.message_item_names()?;
        let is_content_of_item = |expr: &ast::Expr<'_>| {
            items.iter().any(|name| is_var_or_elems_access(expr, name, Some("content")))
        };
        // Macro parameters that receive `message.content` in some call.
        let mut macro_params: Vec<Vec<&str>> = vec![Vec::new(); self.macros.len()];
        for (index, mac) in self.macros.iter().enumerate() {
            let params: Vec<&str> = mac
                .args
                .iter()
                .filter_map(|a| match a {
                    ast::Expr::Var(v) => Some(v.id),
                    _ => None,
                })
                .collect();
            for call in &self.calls {
                if !matches!(&call.expr, ast::Expr::Var(v) if v.id == mac.name) {
                    continue;
                }
                let positional = call.args.iter().filter_map(|a| match a {
                    ast::CallArg::Pos(e) => Some(e),
                    _ => None,
                });
                for (i, arg) in positional.enumerate() {
                    if i < params.len() && is_content_of_item(arg) {
                        macro_params[index].push(params[i]);
                    }
                }
                for arg in &call.args {
                    if let ast::CallArg::Kwarg(key, value) = arg {
                        if params.contains(key) && is_content_of_item(value) {
                            macro_params[index].push(key);
                        }
                    }
                }
            }
        }
        for info in &self.fors {
            if is_content_of_item(info.iter) {
                if !matches!(info.target, ast::Expr::Var(_)) {
                    return None;
                }
                return Some(true);
            }
            let ast::Expr::Var(iter) = info.iter else {
                continue;
            };
            let in_param = info.macro_index.is_some_and(|m| macro_params[m].contains(&iter.id));
            let top_level_content = info.macro_index.is_none() && iter.id == "content";
            if in_param || top_level_content {
                if !matches!(info.target, ast::Expr::Var(_)) {
                    return None;
                }
                return Some(true);
            }
        }
        Some(false)
    }
}

/// `ns.rest` for a `GetAttr` chain on a variable.
fn dotted_name(expr: &ast::Expr<'_>) -> Option<String> {
    let mut parts = Vec::new();
    let mut current = expr;
    loop {
        match current {
            ast::Expr::GetAttr(g) => {
                parts.push(g.name);
                current = &g.expr;
            }
            ast::Expr::Var(v) => {
                parts.push(v.id);
                break;
            }
            _ => return None,
        }
    }
    parts.reverse();
    Some(parts.join("."))
}

/// vLLM's `_is_var_access`: the variable itself, or a dotted namespace
/// attribute `ns.rest`.
fn is_var_access(expr: &ast::Expr<'_>, name: &str) -> bool {
    match expr {
        ast::Expr::Var(v) => v.id == name,
        ast::Expr::GetAttr(g) => match name.rsplit_once('.') {
            Some((base, attr)) => g.name == attr && is_var_access(&g.expr, base),
            None => false,
        },
        _ => false,
    }
}

/// vLLM's `_is_attr_access`: `name[key]` or `name.key`.
fn is_attr_access(expr: &ast::Expr<'_>, name: &str, key: &str) -> bool {
    match expr {
        ast::Expr::GetItem(g) => {
            is_var_access(&g.expr, name)
                && matches!(&g.subscript_expr, ast::Expr::Const(c) if c.value.as_str() == Some(key))
        }
        ast::Expr::GetAttr(g) => g.name == key && is_var_access(&g.expr, name),
        _ => false,
    }
}

/// vLLM's `_is_var_or_elems_access`: through filters, tests and slices.
fn is_var_or_elems_access(expr: &ast::Expr<'_>, name: &str, key: Option<&str>) -> bool {
    match expr {
        ast::Expr::Filter(f) => {
            f.expr.as_ref().is_some_and(|e| is_var_or_elems_access(e, name, key))
        }
        ast::Expr::Test(t) => is_var_or_elems_access(&t.expr, name, key),
        ast::Expr::Slice(s) => is_var_or_elems_access(&s.expr, name, key),
        _ => match key {
            Some(key) => is_attr_access(expr, name, key),
            None => is_var_access(expr, name),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_templates() {
        let qwen = "{%- for message in messages %}{{ message.content }}{% endfor %}";
        assert_eq!(detect_content_format(qwen), ContentFormat::String);
        assert_eq!(detect_content_format("{{ messages[0]['content'] }}"), ContentFormat::String);
    }

    #[test]
    fn openai_templates() {
        for t in [
            "{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}",
            "{% for m in messages %}{% for c in m.content | selectattr('type') %}{% endfor %}{% endfor %}",
            "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m.content %}{% endfor %}{% endfor %}",
            "{% set ns = namespace(rest=messages) %}{% for m in ns.rest %}{% for c in m.content %}{% endfor %}{% endfor %}",
            "{% macro render(parts) %}{% for p in parts %}{{ p }}{% endfor %}{% endmacro %}{% for m in messages %}{{ render(m.content) }}{% endfor %}",
            "{% for m in messages %}{% set content = m.content %}{% endfor %}{% for c in content %}{% endfor %}",
        ] {
            assert_eq!(detect_content_format(t), ContentFormat::OpenAi, "{t}");
        }
    }

    #[test]
    fn unpacking_or_unparsable_falls_back_to_string() {
        assert_eq!(
            detect_content_format(
                "{% for m in messages %}{% for a, b in m.content %}{% endfor %}{% endfor %}"
            ),
            ContentFormat::String
        );
        assert_eq!(detect_content_format("{% for %}"), ContentFormat::String);
    }

    #[test]
    fn generation_tags_do_not_hide_content_loops() {
        let t = "{% macro parse(c) %}{% for p in c %}{% endfor %}{% endmacro %}\
                 {% for m in messages %}{% generation %}{{ parse(m.content) }}{% endgeneration %}{% endfor %}";
        let rewritten = super::super::rewrite_generation_tags(t);
        assert_eq!(detect_content_format(&rewritten), ContentFormat::OpenAi);
    }

    #[test]
    fn developer_mention() {
        assert!(mentions_developer("{% if m.role == 'developer' %}"));
        assert!(mentions_developer(r#"{% if m.role == "developer" %}"#));
        assert!(!mentions_developer("developer"));
    }
}
