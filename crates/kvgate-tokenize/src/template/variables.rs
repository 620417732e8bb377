//! Jinja2's `meta.find_undeclared_variables`, ported to minijinja's AST.
//!
//! vLLM keeps a request's `chat_template_kwargs` only if the template reads
//! them (`resolve_chat_template_kwargs`), and it decides that with Jinja2's
//! own analysis. That analysis is not "read before written": it follows
//! Jinja2's code generator (`idtracking.py`), where
//!
//! - each `for` body, `for ... if` test, `for` else, macro, call block,
//!   filter block, `with` block and `set` block is a frame of its own, whose
//!   names may resolve in the enclosing frames;
//! - `set x = expr` evaluates `expr` before storing `x`;
//! - a name first stored inside an `if` branch is resolved from the context
//!   (Jinja2 always merges three branch tables, body / elif / else, and a
//!   store missing from one of them makes the name a context lookup);
//! - the globals of a plain environment (`range`, `dict`, `namespace`, ...)
//!   are not reported.
//!
//! minijinja's own `undeclared_variables` is more precise, and so filters
//! differently (for instance `set enable_thinking = enable_thinking |
//! default(true)` hides `enable_thinking`); this port reports exactly what
//! Jinja2 reports.

use std::collections::{HashMap, HashSet};

use minijinja::machinery::ast;

/// Jinja2's `DEFAULT_NAMESPACE` globals.
const GLOBALS: [&str; 6] = ["range", "dict", "lipsum", "cycler", "joiner", "namespace"];

/// How a frame obtains a name (Jinja2's `VAR_LOAD_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Load {
    Param,
    Resolve(String),
    Alias,
    Undefined,
}

/// A symbol table (Jinja2's `Symbols`); refs are `(level, name)`, as
/// Jinja2's `l_{level}_{name}` identifiers.
#[derive(Debug, Clone, Default)]
struct Symbols<'p> {
    parent: Option<&'p Symbols<'p>>,
    level: usize,
    refs: HashMap<String, (usize, String)>,
    loads: HashMap<(usize, String), Load>,
    stores: HashSet<String>,
}

impl<'p> Symbols<'p> {
    fn inner(parent: &'p Symbols<'p>) -> Symbols<'p> {
        Symbols { parent: Some(parent), level: parent.level + 1, ..Symbols::default() }
    }

    fn find_ref(&self, name: &str) -> Option<(usize, String)> {
        match self.refs.get(name) {
            Some(r) => Some(r.clone()),
            None => self.parent.and_then(|p| p.find_ref(name)),
        }
    }

    fn define_ref(&mut self, name: &str, load: Load) -> (usize, String) {
        let ident = (self.level, name.to_owned());
        self.refs.insert(name.to_owned(), ident.clone());
        self.loads.insert(ident.clone(), load);
        ident
    }

    fn declare_parameter(&mut self, name: &str) {
        self.stores.insert(name.to_owned());
        self.define_ref(name, Load::Param);
    }

    fn load(&mut self, name: &str) {
        if self.find_ref(name).is_none() {
            self.define_ref(name, Load::Resolve(name.to_owned()));
        }
    }

    fn store(&mut self, name: &str) {
        self.stores.insert(name.to_owned());
        if self.refs.contains_key(name) {
            return;
        }
        let outer = self.parent.and_then(|p| p.find_ref(name));
        self.define_ref(name, if outer.is_some() { Load::Alias } else { Load::Undefined });
    }

    /// Jinja2's `branch_update` over the body, elif and else tables.
    fn branch_update(&mut self, branches: Vec<Symbols<'p>>) {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for branch in &branches {
            for target in &branch.stores {
                if !self.stores.contains(target) {
                    *counts.entry(target.clone()).or_default() += 1;
                }
            }
        }
        let n = branches.len();
        for branch in branches {
            self.refs.extend(branch.refs);
            self.loads.extend(branch.loads);
            self.stores.extend(branch.stores);
        }
        for (name, count) in counts {
            if count == n {
                continue;
            }
            let Some(target) = self.find_ref(&name) else {
                continue;
            };
            let outer = self.parent.and_then(|p| p.find_ref(&name));
            let load = if outer.is_some() { Load::Alias } else { Load::Resolve(name) };
            self.loads.insert(target, load);
        }
    }

    fn report(&self, out: &mut HashSet<String>) {
        for load in self.loads.values() {
            if let Load::Resolve(name) = load {
                if !GLOBALS.contains(&name.as_str()) {
                    out.insert(name.clone());
                }
            }
        }
    }
}

/// The names a template reads from its context, as Jinja2 reports them.
pub(crate) fn undeclared_variables(root: &ast::Stmt<'_>) -> HashSet<String> {
    let mut out = HashSet::new();
    let children: &[ast::Stmt<'_>] = match root {
        ast::Stmt::Template(t) => &t.children,
        other => std::slice::from_ref(other),
    };
    analyze_frame(None, &["self"], &[], children, &mut out);
    out
}

/// One frame: its parameters, the expressions evaluated in it, its body.
fn analyze_frame(
    parent: Option<&Symbols<'_>>,
    params: &[&str],
    exprs: &[&ast::Expr<'_>],
    body: &[ast::Stmt<'_>],
    out: &mut HashSet<String>,
) {
    let mut symbols = match parent {
        Some(p) => Symbols::inner(p),
        None => Symbols::default(),
    };
    for param in params {
        symbols.declare_parameter(param);
    }
    for expr in exprs {
        visit_expr(&mut symbols, expr);
    }
    for stmt in body {
        visit_stmt(&mut symbols, stmt);
    }
    symbols.report(out);
    for stmt in body {
        inner_frames(&symbols, stmt, out);
    }
}

/// Names bound by an assignment or loop target.
fn target_names<'a>(target: &ast::Expr<'a>, names: &mut Vec<&'a str>) {
    match target {
        ast::Expr::Var(v) => names.push(v.id),
        ast::Expr::List(l) => l.items.iter().for_each(|e| target_names(e, names)),
        ast::Expr::Tuple(t) => t.items.iter().for_each(|e| target_names(e, names)),
        _ => {}
    }
}

fn macro_params<'a>(m: &ast::Macro<'a>) -> Vec<&'a str> {
    let mut names = vec!["caller", "varargs", "kwargs"];
    m.args.iter().for_each(|a| target_names(a, &mut names));
    names
}

/// Jinja2's `FrameSymbolVisitor` on one statement of the current frame.
fn visit_stmt(symbols: &mut Symbols<'_>, stmt: &ast::Stmt<'_>) {
    use ast::Stmt;
    match stmt {
        Stmt::Template(t) => t.children.iter().for_each(|s| visit_stmt(symbols, s)),
        Stmt::EmitExpr(e) => visit_expr(symbols, &e.expr),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) | Stmt::Block(_) => {}
        Stmt::ForLoop(f) => visit_expr(symbols, &f.iter),
        Stmt::IfCond(c) => {
            visit_expr(symbols, &c.expr);
            let mut branches = Vec::with_capacity(3);
            for body in [&c.true_body[..], &[], &c.false_body[..]] {
                let mut branch = symbols.clone();
                body.iter().for_each(|s| visit_stmt(&mut branch, s));
                branches.push(branch);
            }
            symbols.branch_update(branches);
        }
        Stmt::WithBlock(w) => {
            w.assignments.iter().for_each(|(_, value)| visit_expr(symbols, value))
        }
        Stmt::Set(s) => {
            visit_expr(symbols, &s.expr);
            match &s.target {
                ast::Expr::GetAttr(g) => visit_expr(symbols, &g.expr),
                target => {
                    let mut names = Vec::new();
                    target_names(target, &mut names);
                    names.iter().for_each(|n| symbols.store(n));
                }
            }
        }
        Stmt::SetBlock(s) => {
            let mut names = Vec::new();
            target_names(&s.target, &mut names);
            names.iter().for_each(|n| symbols.store(n));
        }
        Stmt::AutoEscape(a) => {
            visit_expr(symbols, &a.enabled);
            a.body.iter().for_each(|s| visit_stmt(symbols, s));
        }
        Stmt::FilterBlock(f) => visit_expr(symbols, &f.filter),
        Stmt::Macro(m) => symbols.store(m.name),
        Stmt::CallBlock(c) => visit_call(symbols, &c.call),
        Stmt::Do(d) => visit_call(symbols, &d.call),
        Stmt::Import(i) => {
            visit_expr(symbols, &i.expr);
            let mut names = Vec::new();
            target_names(&i.name, &mut names);
            names.iter().for_each(|n| symbols.store(n));
        }
        Stmt::FromImport(i) => {
            visit_expr(symbols, &i.expr);
            for (name, alias) in &i.names {
                let mut names = Vec::new();
                target_names(alias.as_ref().unwrap_or(name), &mut names);
                names.iter().for_each(|n| symbols.store(n));
            }
        }
        Stmt::Extends(e) => visit_expr(symbols, &e.name),
        Stmt::Include(i) => visit_expr(symbols, &i.name),
    }
}

/// The frames nested in one statement of a frame, analyzed with that
/// frame's final table as parent (as Jinja2's code generator does).
fn inner_frames(symbols: &Symbols<'_>, stmt: &ast::Stmt<'_>, out: &mut HashSet<String>) {
    use ast::Stmt;
    match stmt {
        Stmt::Template(t) => t.children.iter().for_each(|s| inner_frames(symbols, s, out)),
        Stmt::IfCond(c) => {
            c.true_body.iter().for_each(|s| inner_frames(symbols, s, out));
            c.false_body.iter().for_each(|s| inner_frames(symbols, s, out));
        }
        Stmt::AutoEscape(a) => a.body.iter().for_each(|s| inner_frames(symbols, s, out)),
        Stmt::ForLoop(f) => {
            let mut params = vec!["loop"];
            target_names(&f.target, &mut params);
            analyze_frame(Some(symbols), &params, &[], &f.body, out);
            if let Some(test) = &f.filter_expr {
                let mut test_params = Vec::new();
                target_names(&f.target, &mut test_params);
                analyze_frame(Some(symbols), &test_params, &[test], &[], out);
            }
            if !f.else_body.is_empty() {
                analyze_frame(Some(symbols), &[], &[], &f.else_body, out);
            }
        }
        Stmt::Macro(m) => {
            let defaults: Vec<&ast::Expr<'_>> = m.defaults.iter().collect();
            analyze_frame(Some(symbols), &macro_params(m), &defaults, &m.body, out);
        }
        Stmt::CallBlock(c) => {
            let m = &c.macro_decl;
            let defaults: Vec<&ast::Expr<'_>> = m.defaults.iter().collect();
            analyze_frame(Some(symbols), &macro_params(m), &defaults, &m.body, out);
        }
        Stmt::FilterBlock(f) => analyze_frame(Some(symbols), &[], &[], &f.body, out),
        Stmt::SetBlock(s) => {
            let filter: Vec<&ast::Expr<'_>> = s.filter.iter().collect();
            analyze_frame(Some(symbols), &[], &filter, &s.body, out);
        }
        Stmt::WithBlock(w) => {
            let mut params = Vec::new();
            w.assignments.iter().for_each(|(target, _)| target_names(target, &mut params));
            analyze_frame(Some(symbols), &params, &[], &w.body, out);
        }
        Stmt::Block(b) => analyze_frame(None, &["self"], &[], &b.body, out),
        _ => {}
    }
}

fn visit_call(symbols: &mut Symbols<'_>, call: &ast::Call<'_>) {
    visit_expr(symbols, &call.expr);
    visit_args(symbols, &call.args);
}

fn visit_args(symbols: &mut Symbols<'_>, args: &[ast::CallArg<'_>]) {
    for arg in args {
        match arg {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => visit_expr(symbols, e),
        }
    }
}

fn visit_expr(symbols: &mut Symbols<'_>, expr: &ast::Expr<'_>) {
    use ast::Expr;
    match expr {
        Expr::Var(v) => symbols.load(v.id),
        Expr::Const(_) => {}
        Expr::Slice(s) => {
            visit_expr(symbols, &s.expr);
            for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                visit_expr(symbols, part);
            }
        }
        Expr::UnaryOp(u) => visit_expr(symbols, &u.expr),
        Expr::BinOp(b) => {
            visit_expr(symbols, &b.left);
            visit_expr(symbols, &b.right);
        }
        Expr::Compare(c) => {
            visit_expr(symbols, &c.expr);
            c.ops.iter().for_each(|op| visit_expr(symbols, &op.expr));
        }
        Expr::IfExpr(i) => {
            visit_expr(symbols, &i.test_expr);
            visit_expr(symbols, &i.true_expr);
            if let Some(f) = &i.false_expr {
                visit_expr(symbols, f);
            }
        }
        Expr::Filter(f) => {
            if let Some(e) = &f.expr {
                visit_expr(symbols, e);
            }
            visit_args(symbols, &f.args);
        }
        Expr::Test(t) => {
            visit_expr(symbols, &t.expr);
            visit_args(symbols, &t.args);
        }
        Expr::GetAttr(g) => visit_expr(symbols, &g.expr),
        Expr::GetItem(g) => {
            visit_expr(symbols, &g.expr);
            visit_expr(symbols, &g.subscript_expr);
        }
        Expr::Call(c) => visit_call(symbols, c),
        Expr::List(l) => l.items.iter().for_each(|e| visit_expr(symbols, e)),
        Expr::Tuple(t) => t.items.iter().for_each(|e| visit_expr(symbols, e)),
        Expr::Map(m) => {
            m.keys.iter().for_each(|e| visit_expr(symbols, e));
            m.values.iter().for_each(|e| visit_expr(symbols, e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(source: &str) -> Vec<String> {
        let syntax = minijinja::syntax::SyntaxConfig::default();
        let root = minijinja::machinery::parse(source, "t", syntax).unwrap();
        let mut v: Vec<String> = undeclared_variables(&root).into_iter().collect();
        v.sort();
        v
    }

    /// Each expectation is what `jinja2.meta.find_undeclared_variables`
    /// returns for the same source (Jinja2 3.1.6).
    #[test]
    fn matches_jinja2() {
        let cases: [(&str, &[&str]); 15] = [
            ("{% if a %}{% set x = 1 %}{% else %}{% set x = 2 %}{% endif %}{{ x }}", &["a", "x"]),
            ("{% if a %}{% set x = 1 %}{% elif b %}{% set x = 3 %}{% else %}{% set x = 2 %}{% endif %}{{ x }}", &["a", "b", "x"]),
            ("{% if a %}{% set x = 1 %}{% endif %}{{ x }}", &["a", "x"]),
            ("{% set x = x|default(1) %}{{ x }}", &["x"]),
            ("{% for m in messages %}{% if m %}{% set c = 1 %}{% else %}{% set c = 2 %}{% endif %}{{ c }}{% endfor %}", &["c", "messages"]),
            ("{% set x = 1 %}{% if a %}{% set x = 2 %}{% endif %}{{ x }}", &["a"]),
            ("{% for m in messages %}{{ loop.index }}{% endfor %}{{ loop }}", &["loop", "messages"]),
            ("{% macro f(a, b=c) %}{{ a }}{{ d }}{{ caller() }}{% endmacro %}{{ f(1) }}", &["c", "d"]),
            ("{% if a %}{% set x = 1 %}{% else %}{% if b %}{% set x = 2 %}{% else %}{% set x = 3 %}{% endif %}{% endif %}{{ x }}", &["a", "b", "x"]),
            ("{% with y = z %}{{ y }}{{ w }}{% endwith %}", &["w", "z"]),
            ("{% set ns = namespace(a=1) %}{% set ns.a = q %}{{ ns.a }}", &["q"]),
            ("{% for x in y if x > t %}{{ x }}{% else %}{{ e }}{% endfor %}", &["e", "t", "y"]),
            ("{% set b %}{{ inner }}{% endset %}{{ b }}", &["inner"]),
            ("{% filter upper %}{{ f1 }}{% endfilter %}", &["f1"]),
            ("{% for m in messages %}{% set content = m.content %}{% if x %}{% set content = 2 %}{% endif %}{{ content }}{% endfor %}", &["messages", "x"]),
        ];
        for (source, want) in cases {
            assert_eq!(vars(source), want, "{source}");
        }
    }
}
