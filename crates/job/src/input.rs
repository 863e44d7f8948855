//! The spec as read, before it is checked: one tree for HCL and JSON alike, in source order,
//! with the line of each node when the input is HCL.
//!
//! Nothing here judges the structure (which keys, which types): that is the checker's work,
//! so every such error gets the checker's field path. What is refused here is text that does
//! not parse at all.

use std::{fmt, path::Path};

use berth_volume::SpecError;
use hcl::{
    edit::{
        Span as _,
        expr::{Expression, ObjectKey},
        structure::{Body, Structure},
    },
    eval::Evaluate as _,
};

use crate::{
    template::{Part, Template},
    vars::{self, Eval, Inputs},
};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A value and, for HCL, the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub line: Option<usize>,
    pub v: V,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum V {
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(String),
    List(Vec<Node>),
    /// An object or a block body: keys in source order, repeats kept (repeated HCL blocks are
    /// repeated keys).
    Obj(Vec<(String, Node)>),
    /// An HCL block (with or without labels); its body is an `Obj`.
    Block {
        labels: Vec<String>,
        body: Box<Node>,
    },
    /// A string with `${…}` runtime references left in it.
    Tmpl(Vec<Part>),
    /// An expression that could not be evaluated, and why.
    Bad(String),
}

impl V {
    /// What the value is, for "expected …, found …".
    pub fn kind(&self) -> &'static str {
        match self {
            V::Null => "null",
            V::Bool(_) => "a bool",
            V::Num(_) => "a number",
            V::Str(_) => "a string",
            V::List(_) => "a list",
            V::Obj(_) => "an object",
            V::Block { .. } => "a block",
            V::Tmpl(_) => "a string",
            V::Bad(_) => "an expression",
        }
    }
}

/// Byte offsets of line starts, to turn spans into lines.
pub(crate) struct Lines(Vec<usize>);

impl Lines {
    pub(crate) fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self(starts)
    }

    pub(crate) fn of(&self, offset: Option<usize>) -> Option<usize> {
        offset.map(|o| self.0.partition_point(|s| *s <= o))
    }
}

/// Parses HCL text into a tree, evaluating its HCL2 variables, locals and functions (with
/// `inputs`) and leaving runtime references in templates. Syntax errors, and problems with the
/// variables, fail here; they name the line and never repeat the source (it could hold a mount
/// flag). An expression that cannot be evaluated becomes [`V::Bad`], for the checker to report
/// with its field.
pub(crate) fn from_hcl(
    file: &Path,
    text: &str,
    inputs: &Inputs<'_>,
) -> Result<Node, Vec<SpecError>> {
    let body = hcl::edit::parser::parse_body(text).map_err(|e| {
        let at = e.location();
        vec![SpecError {
            file: file.to_path_buf(),
            line: Some(at.line()),
            field: String::new(),
            message: format!("column {}: {}", at.column(), e.message()),
        }]
    })?;
    let lines = Lines::new(text);
    let eval = vars::context(file, &body, &lines, inputs)?;
    Ok(Node {
        line: None,
        v: body_of(&body, &lines, &eval, true),
    })
}

/// Blocks evaluated before the rest ([`vars::context`]), skipped at the top level.
const VARIABLE_BLOCKS: [&str; 3] = ["variable", "variables", "locals"];

fn body_of(body: &Body, lines: &Lines, eval: &Eval, top: bool) -> V {
    let mut out = Vec::new();
    for s in body.iter() {
        match s {
            Structure::Attribute(a) => {
                let line = lines.of(a.span().map(|r| r.start));
                out.push((a.key.to_string(), expr(&a.value, line, lines, eval)));
            }
            Structure::Block(b) => {
                if top && VARIABLE_BLOCKS.contains(&b.ident.as_str()) {
                    continue;
                }
                let line = lines.of(b.span().map(|r| r.start));
                let body = Node {
                    line,
                    v: body_of(&b.body, lines, eval, false),
                };
                let v = V::Block {
                    labels: b.labels.iter().map(|l| l.as_str().to_string()).collect(),
                    body: Box::new(body),
                };
                out.push((b.ident.to_string(), Node { line, v }));
            }
        }
    }
    V::Obj(out)
}

/// An expression's value; `line` is where it starts (the attribute's line when hcl gives no
/// span of its own).
fn expr(e: &Expression, line: Option<usize>, lines: &Lines, eval: &Eval) -> Node {
    let line = lines.of(e.span().map(|r| r.start)).or(line);
    let v = match e {
        Expression::Null(_) => V::Null,
        Expression::Bool(b) => V::Bool(*b.value()),
        Expression::Number(n) => number(n.value()).map_or(V::Bad("not a number".into()), V::Num),
        Expression::String(s) => V::Str(s.value().clone()),
        Expression::Array(items) => {
            V::List(items.iter().map(|x| expr(x, line, lines, eval)).collect())
        }
        Expression::Object(obj) => {
            let mut out = Vec::new();
            for (k, v) in obj.iter() {
                let key = match k {
                    ObjectKey::Ident(id) => id.to_string(),
                    ObjectKey::Expression(Expression::String(s)) => s.value().clone(),
                    ObjectKey::Expression(_) => {
                        return Node {
                            line,
                            v: V::Bad("object keys must be names or strings".into()),
                        };
                    }
                };
                let at = lines.of(k.span().map(|r| r.start)).or(line);
                out.push((key, expr(v.expr(), at, lines, eval)));
            }
            V::Obj(out)
        }
        Expression::StringTemplate(_) | Expression::HeredocTemplate(_) => {
            match hcl::Expression::from(e.clone()) {
                hcl::Expression::TemplateExpr(t) => template(&t, eval),
                other => evaluated(&other, eval),
            }
        }
        Expression::Parenthesis(p) => return expr(p.inner(), line, lines, eval),
        other => evaluated(&hcl::Expression::from(other.clone()), eval),
    };
    Node { line, v }
}

/// The value of an expression evaluated now (variables, locals, functions, operators).
fn evaluated(e: &hcl::Expression, eval: &Eval) -> V {
    match e.evaluate(&eval.ctx) {
        Ok(v) => from_value(v),
        Err(err) => V::Bad(bad_expression(e, &err.to_string())),
    }
}

/// Why an expression could not be evaluated, in words.
fn bad_expression(e: &hcl::Expression, why: &str) -> String {
    if runtime_ref(e).is_some() {
        return "runtime variables are interpolated in strings only, where Nomad interpolates them: \"${…}\"".into();
    }
    format!("cannot evaluate: {}", vars::one_line(why))
}

fn from_value(v: hcl::Value) -> V {
    match v {
        hcl::Value::Null => V::Null,
        hcl::Value::Bool(b) => V::Bool(b),
        hcl::Value::Number(n) => number(&n).map_or(V::Bad("not a number".into()), V::Num),
        hcl::Value::String(s) => V::Str(s),
        hcl::Value::Array(items) => V::List(
            items
                .into_iter()
                .map(|x| Node {
                    line: None,
                    v: from_value(x),
                })
                .collect(),
        ),
        hcl::Value::Object(o) => V::Obj(
            o.into_iter()
                .map(|(k, x)| {
                    (
                        k,
                        Node {
                            line: None,
                            v: from_value(x),
                        },
                    )
                })
                .collect(),
        ),
    }
}

/// A reference left for later: a bare name (`NOMAD_TASK_DIR`, an env key) or a dotted path
/// under `attr`, `node` or `meta`, which the node fills at runtime, or under `device`, which a
/// device block's constraints and affinities keep as written (`${device.attr.memory}`) for
/// placement to resolve against each device group.
fn runtime_ref(e: &hcl::Expression) -> Option<String> {
    match e {
        hcl::Expression::Variable(v) if !matches!(v.as_str(), "var" | "local") => {
            Some(v.as_str().to_owned())
        }
        hcl::Expression::Traversal(t) => {
            let hcl::Expression::Variable(root) = &t.expr else {
                return None;
            };
            if !matches!(root.as_str(), "attr" | "node" | "meta" | "device") {
                return None;
            }
            let mut name = root.as_str().to_owned();
            for op in &t.operators {
                match op {
                    hcl::expr::TraversalOperator::GetAttr(id) => {
                        name.push('.');
                        name.push_str(id.as_str());
                    }
                    hcl::expr::TraversalOperator::Index(hcl::Expression::String(s)) => {
                        name.push('.');
                        name.push_str(s);
                    }
                    _ => return None,
                }
            }
            Some(name)
        }
        _ => None,
    }
}

/// A template's value: its literal parts, interpolations of runtime references kept as
/// references, every other interpolation evaluated now. Directives (`%{…}`) are evaluated
/// whole, so they cannot hold runtime references.
fn template(expr: &hcl::TemplateExpr, eval: &Eval) -> V {
    let t = match hcl::Template::from_expr(expr) {
        Ok(t) => t,
        Err(e) => return V::Bad(format!("bad template: {}", vars::one_line(&e.to_string()))),
    };
    let mut parts = Vec::new();
    for el in t.elements() {
        match el {
            hcl::template::Element::Literal(l) => parts.push(Part::Lit(l.clone())),
            hcl::template::Element::Interpolation(i) => match runtime_ref(&i.expr) {
                Some(name) => parts.push(Part::Var(name)),
                None => match i.expr.evaluate(&eval.ctx) {
                    Ok(v) => match vars::as_text(&v) {
                        Some(s) => parts.push(Part::Lit(s)),
                        None => {
                            return V::Bad(
                                "cannot interpolate a list or a map into a string".into(),
                            );
                        }
                    },
                    Err(err) => return V::Bad(bad_expression(&i.expr, &err.to_string())),
                },
            },
            hcl::template::Element::Directive(_) => {
                let whole = hcl::Expression::TemplateExpr(Box::new(expr.clone()));
                return evaluated(&whole, eval);
            }
        }
    }
    let t = Template::from_parts(parts, None);
    match t.as_literal() {
        Some(s) => V::Str(s.to_owned()),
        None => V::Tmpl(t.parts().to_vec()),
    }
}

/// Strings of a JSON spec read as HCL's JSON form reads them: as templates.
pub(crate) fn json_templates(n: &mut Node, eval: &Eval) {
    match &mut n.v {
        V::Str(s) if s.contains("${") || s.contains("%{") => {
            n.v = template(&hcl::TemplateExpr::QuotedString(s.clone()), eval);
        }
        V::List(items) => items.iter_mut().for_each(|x| json_templates(x, eval)),
        V::Obj(items) => items.iter_mut().for_each(|(_, x)| json_templates(x, eval)),
        V::Block { body, .. } => json_templates(body, eval),
        _ => {}
    }
}

fn number(n: &hcl::Number) -> Option<serde_json::Number> {
    if let Some(u) = n.as_u64() {
        Some(u.into())
    } else if let Some(i) = n.as_i64() {
        Some(i.into())
    } else {
        serde_json::Number::from_f64(n.as_f64()?)
    }
}

/// Parses JSON text into a tree (no lines). Only a syntax error fails here; serde_json's
/// message names the line and column and never repeats the text.
pub(crate) fn from_json(file: &Path, text: &str) -> Result<Node, SpecError> {
    serde_json::from_str::<Node>(text).map_err(|e| SpecError {
        file: file.to_path_buf(),
        line: Some(e.line()).filter(|l| *l > 0),
        field: String::new(),
        message: e.to_string(),
    })
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

fn node(v: V) -> Node {
    Node { line: None, v }
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(node(V::Null))
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Node, E> {
        Ok(node(V::Bool(b)))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Node, E> {
        Ok(node(V::Num(n.into())))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Node, E> {
        Ok(node(V::Num(n.into())))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Node, E> {
        Ok(node(
            serde_json::Number::from_f64(n).map_or(V::Null, V::Num),
        ))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Node, E> {
        Ok(node(V::Str(s.to_string())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Node, E> {
        Ok(node(V::Str(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(node(V::List(out)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Node>()? {
            out.push((k, v));
        }
        Ok(node(V::Obj(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hcl(text: &str) -> Node {
        let inputs = Inputs {
            vars: &[],
            var_files: &[],
        };
        from_hcl(Path::new("t.hcl"), text, &inputs).unwrap()
    }

    fn obj(n: &Node) -> &[(String, Node)] {
        match &n.v {
            V::Obj(o) => o,
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn hcl_keeps_order_repeats_and_lines() {
        let n = hcl("a = 1\n\nb \"x\" {\n  c = [\n    \"p\",\n    \"q\",\n  ]\n}\nb {}\nd = 2\n");
        let top = obj(&n);
        let keys: Vec<&str> = top.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "b", "d"]);
        assert_eq!(top[0].1.line, Some(1));
        assert_eq!(top[3].1.line, Some(10));
        let V::Block { labels, body } = &top[1].1.v else {
            panic!("{:?}", top[1].1)
        };
        assert_eq!(labels, &["x"]);
        assert_eq!(body.line, Some(3));
        let c = &obj(body)[0].1;
        assert_eq!(c.line, Some(4));
        let V::List(items) = &c.v else { panic!() };
        assert_eq!(
            items.iter().map(|i| i.line).collect::<Vec<_>>(),
            [Some(5), Some(6)]
        );
        let V::Block { labels, body } = &top[2].1.v else {
            panic!("{:?}", top[2].1)
        };
        assert!(labels.is_empty());
        assert_eq!(
            **body,
            Node {
                line: Some(9),
                v: V::Obj(vec![])
            }
        );
    }

    #[test]
    fn hcl_evaluates_now_and_keeps_runtime_references() {
        let n = hcl(concat!(
            "a = \"$${X} and %%{y}\"\n",
            "b = \"${X}\"\n",
            "c = var.x\n",
            "d = upper(\"x\")\n",
            "e = (\"p\")\n",
            "f = { \"k.1\" = \"v\", k2 = 2 }\n",
            "g = <<-EOT\n    one\n      two\n    EOT\n",
            "h = 1.5\n",
            "i = -3\n",
            "j = \"a\\tb\"\n",
            "k = { (x) = 1 }\n",
            "l = \"${device.attr.memory} ${device.model}\"\n",
            "m = \"${var.x}${device.attr.memory}\"\n",
        ));
        let top = obj(&n);
        let get = |k: &str| &top.iter().find(|(key, _)| key == k).unwrap().1.v;
        assert_eq!(get("a"), &V::Str("${X} and %{y}".into()));
        assert_eq!(get("b"), &V::Tmpl(vec![Part::Var("X".into())]));
        assert!(matches!(get("c"), V::Bad(_)), "{:?}", get("c"));
        assert_eq!(get("d"), &V::Str("X".into()));
        assert_eq!(get("e"), &V::Str("p".into()));
        let V::Obj(f) = get("f") else { panic!() };
        assert_eq!(f[0].0, "k.1");
        assert_eq!(f[1].1.v, V::Num(2.into()));
        assert_eq!(get("g"), &V::Str("one\n  two\n".into()));
        assert!(matches!(get("h"), V::Num(n) if n.as_f64() == Some(1.5)));
        assert_eq!(get("i"), &V::Num((-3).into()));
        assert_eq!(get("j"), &V::Str("a\tb".into()));
        assert!(matches!(get("k"), V::Bad(_)));
        assert_eq!(
            get("l"),
            &V::Tmpl(vec![
                Part::Var("device.attr.memory".into()),
                Part::Lit(" ".into()),
                Part::Var("device.model".into())
            ])
        );
        assert!(matches!(get("m"), V::Bad(_)), "var.x is not declared here");
    }

    #[test]
    fn hcl_syntax_errors_name_line_and_column_only() {
        let inputs = Inputs {
            vars: &[],
            var_files: &[],
        };
        let e = from_hcl(
            Path::new("/j.hcl"),
            "a = 1\nb = [\"SECRETFLAG\" ]]\n",
            &inputs,
        )
        .unwrap_err()
        .remove(0);
        assert_eq!((e.line, e.field.as_str()), (Some(2), ""));
        assert!(e.message.starts_with("column "), "{e}");
        assert!(!e.to_string().contains("SECRETFLAG"), "{e}");
    }

    #[test]
    fn json_keeps_order_and_repeats() {
        let n = from_json(
            Path::new("j.json"),
            r#"{"b": 1, "a": [true, null], "b": 2.5}"#,
        )
        .unwrap();
        let top = obj(&n);
        let keys: Vec<&str> = top.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
        assert!(top.iter().all(|(_, n)| n.line.is_none()));
        let e = from_json(Path::new("j.json"), "{\n\"a\": [\"SECRETFLAG\" }").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(!e.to_string().contains("SECRETFLAG"), "{e}");
    }

    #[test]
    fn serde_json_refuses_deep_json_by_itself_too() {
        // Specs reach this only after the depth check (64 levels). Without it, serde_json's
        // own limit (128 levels) still answers with a line, on a stack the size of a tokio
        // worker's (2 MiB; 128 levels overflow 256 KiB in a debug build).
        let outcome = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(|| {
                [
                    format!(
                        "{{\n\"a\": {}1{}}}",
                        "{\"\":".repeat(200_000),
                        "}".repeat(200_000)
                    ),
                    format!(
                        "{{\n\"a\": {}{}}}",
                        "[".repeat(200_000),
                        "]".repeat(200_000)
                    ),
                ]
                .map(|text| from_json(Path::new("d.json"), &text).unwrap_err())
            })
            .expect("thread")
            .join()
            .expect("no overflow");
        for e in outcome {
            assert_eq!(e.line, Some(2), "{e}");
            assert!(e.message.starts_with("recursion limit exceeded"), "{e}");
        }
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;

    #[test]
    fn escapes_in_templates_are_read_once() {
        let inputs = Inputs {
            vars: &[],
            var_files: &[],
        };
        let n = from_hcl(
            Path::new("t.hcl"),
            "a = \"p\\\\n ${NOMAD_TASK_NAME} \\\"q\\\"\\t$${x}\"\n",
            &inputs,
        )
        .unwrap();
        let V::Obj(top) = &n.v else { panic!() };
        assert_eq!(
            top[0].1.v,
            V::Tmpl(vec![
                Part::Lit("p\\n ".into()),
                Part::Var("NOMAD_TASK_NAME".into()),
                Part::Lit(" \"q\"\t${x}".into())
            ])
        );
        let mut j = from_json(
            Path::new("t.json"),
            r#"{"a": "p\\n ${NOMAD_TASK_NAME} $${x}", "b": "plain\\n"}"#,
        )
        .unwrap();
        json_templates(&mut j, &Eval::bare());
        let V::Obj(top) = &j.v else { panic!() };
        assert_eq!(
            top[0].1.v,
            V::Tmpl(vec![
                Part::Lit("p\\n ".into()),
                Part::Var("NOMAD_TASK_NAME".into()),
                Part::Lit(" ${x}".into())
            ])
        );
        assert_eq!(top[1].1.v, V::Str("plain\\n".into()));
    }
}
