//! HCL input: the parsed body as a JSON value (HCL's JSON form: one block is an object,
//! repeated blocks an array), the lines fields sit on, for error messages, and the rewrite that
//! lets HCL1-style Nomad specs through an HCL2 parser.
//!
//! Only literal values are accepted: berth does not evaluate variables, functions or
//! interpolation in volume specs. Nothing here puts a value into an error message.

use std::collections::HashMap;

use hcl::{Body, Expression, ObjectKey, Structure, Template, template::Element};
use serde_json::{Map, Value};

use crate::field::FieldPath;

/// An error in the structure: where, and what (never a value).
pub(crate) type Located = (FieldPath, String);

/// The body as JSON. Duplicate attributes, an attribute and a block of one name, labelled
/// blocks and non-literal expressions are errors.
pub(crate) fn body_to_json(body: &Body, path: &FieldPath) -> Result<Value, Located> {
    enum Seen {
        Attr,
        Block(usize),
    }
    let mut out = Map::new();
    let mut seen: HashMap<&str, Seen> = HashMap::new();
    for s in body.iter() {
        match s {
            Structure::Attribute(a) => {
                let key = a.key();
                if seen.insert(key, Seen::Attr).is_some() {
                    return Err((path.key(key), "declared more than once".into()));
                }
                out.insert(key.to_string(), expr_to_json(a.expr(), &path.key(key))?);
            }
            Structure::Block(b) => {
                let key = b.identifier();
                let n = match seen.get(key) {
                    None => 0,
                    Some(Seen::Block(n)) => *n,
                    Some(Seen::Attr) => {
                        return Err((path.key(key), "declared more than once".into()));
                    }
                };
                let here = path.key(key).at(n);
                if !b.labels().is_empty() {
                    return Err((here, "this block takes no labels".into()));
                }
                let v = body_to_json(b.body(), &here)?;
                seen.insert(key, Seen::Block(n + 1));
                match out.remove(key) {
                    None => out.insert(key.to_string(), v),
                    Some(Value::Array(mut all)) if n > 1 => {
                        all.push(v);
                        out.insert(key.to_string(), Value::Array(all))
                    }
                    Some(first) => out.insert(key.to_string(), Value::Array(vec![first, v])),
                };
            }
        }
    }
    Ok(Value::Object(out))
}

const NOT_LITERAL: &str =
    "must be a literal value (berth does not evaluate variables, functions or interpolation)";

fn expr_to_json(e: &Expression, path: &FieldPath) -> Result<Value, Located> {
    Ok(match e {
        Expression::Null => Value::Null,
        Expression::Bool(b) => Value::Bool(*b),
        Expression::Number(n) => {
            serde_json::to_value(n).map_err(|_| (path.clone(), "not a valid number".into()))?
        }
        Expression::String(s) => Value::String(s.clone()),
        Expression::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| expr_to_json(x, &path.at(i)))
                .collect::<Result<_, _>>()?,
        ),
        Expression::Object(obj) => {
            let mut out = Map::new();
            for (k, v) in obj {
                let key = match k {
                    ObjectKey::Identifier(id) => id.to_string(),
                    ObjectKey::Expression(Expression::String(s)) => s.clone(),
                    _ => {
                        return Err((path.clone(), format!("object keys {NOT_LITERAL}")));
                    }
                };
                let here = path.key(&key);
                if out.contains_key(&key) {
                    return Err((here, "given more than once".into()));
                }
                out.insert(key, expr_to_json(v, &here)?);
            }
            Value::Object(out)
        }
        Expression::TemplateExpr(t) => {
            let template =
                Template::from_expr(t).map_err(|_| (path.clone(), NOT_LITERAL.to_string()))?;
            let mut s = String::new();
            for el in template.elements() {
                match el {
                    Element::Literal(l) => s.push_str(l),
                    _ => return Err((path.clone(), NOT_LITERAL.into())),
                }
            }
            Value::String(s)
        }
        Expression::Parenthesis(inner) => expr_to_json(inner, path)?,
        _ => return Err((path.clone(), NOT_LITERAL.into())),
    })
}

/// A key in the source and the keys nested in it (block body or object literal).
#[derive(Debug)]
pub(crate) struct Node {
    key: String,
    line: usize,
    children: Vec<Node>,
}

/// The line of the deepest part of `path` found in `outline` (a [`Scan`]'s).
pub(crate) fn line_of(outline: &[Node], path: &FieldPath) -> Option<usize> {
    let mut nodes = outline;
    let mut line = None;
    for seg in &path.0 {
        let Some(node) = nodes
            .iter()
            .filter(|n| n.key == seg.name)
            .nth(seg.index.unwrap_or(0))
        else {
            break;
        };
        line = Some(node.line);
        nodes = &node.children;
    }
    line
}

/// The line of each key directly in the part of `outline` that `path` names (its first
/// occurrence), in one pass; empty when the text has no such part.
pub(crate) fn key_lines<'a>(outline: &'a [Node], path: &FieldPath) -> HashMap<&'a str, usize> {
    let mut nodes = outline;
    for seg in &path.0 {
        match nodes
            .iter()
            .filter(|n| n.key == seg.name)
            .nth(seg.index.unwrap_or(0))
        {
            Some(node) => nodes = &node.children,
            None => return HashMap::new(),
        }
    }
    let mut lines = HashMap::new();
    for n in nodes {
        lines.entry(n.key.as_str()).or_insert(n.line);
    }
    lines
}

/// What a lenient reading of an HCL text finds: its keys with their 1-based lines, nested as in
/// the text, and the edits that turn Nomad's HCL1 forms into HCL2.
///
/// Nomad reads volume specs as HCL1, and its documentation writes forms HCL2 refuses:
/// nested blocks on one line (`topology { segments { rack = "R1" } }`), commas between the
/// attributes of a block (`segments { rack = "R2", zone = "us-east-1a" }`) and quoted keys in a
/// block (`segments { "rack" = "R2" }`). [`Scan::hcl2`] rewrites those: a newline after each
/// block's `{` and before its `}`, commas between block items become newlines, and a block of
/// attributes only with a quoted key becomes an object attribute (`segments = { … }`).
/// Line numbers are only read from the original text. The reading recurses once per brace, at
/// most [`berth_input::MAX_NESTING`] deep: what is nested deeper is skipped, whatever the text
/// (this reading is lenient, and runs on texts the HCL parser refused too).
pub(crate) struct Scan {
    pub outline: Vec<Node>,
    edits: Vec<(usize, Edit)>,
    chars: Vec<char>,
}

#[derive(Debug, Clone, Copy)]
enum Edit {
    /// Put this before the char at the position.
    Insert(&'static str),
    /// Put a newline in place of the char at the position.
    Newline,
}

impl Scan {
    /// Reads `text` leniently (meant for text an HCL parser accepts, in either dialect; what it
    /// cannot follow it skips).
    pub fn new(text: &str) -> Self {
        let chars: Vec<char> = text.chars().collect();
        let toks = lex(&chars);
        let mut i = 0;
        let mut edits = Vec::new();
        let (outline, _) = body_of(&toks, &mut i, false, true, 0, &mut edits);
        Self {
            outline,
            edits,
            chars,
        }
    }

    /// The text with Nomad's HCL1 forms rewritten as HCL2, and for each of its lines the
    /// original line (1-based); `None` when there is nothing to rewrite.
    pub fn hcl2(&self) -> Option<(String, Vec<usize>)> {
        if self.edits.is_empty() {
            return None;
        }
        let mut edits = self.edits.clone();
        edits.sort_by_key(|(pos, _)| *pos);
        let mut out = String::with_capacity(self.chars.len() + edits.len() * 3);
        let mut lines = vec![1];
        let mut line = 1;
        let mut next = edits.iter().peekable();
        for (pos, c) in self.chars.iter().enumerate() {
            let mut replaced = false;
            while let Some((_, e)) = next.next_if(|(p, _)| *p == pos) {
                match e {
                    Edit::Insert(s) => {
                        out.push_str(s);
                        lines.extend(s.chars().filter(|c| *c == '\n').map(|_| line));
                    }
                    Edit::Newline => replaced = true,
                }
            }
            if replaced {
                out.push('\n');
                lines.push(line);
            } else {
                out.push(*c);
                if *c == '\n' {
                    line += 1;
                    lines.push(line);
                }
            }
        }
        Some((out, lines))
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    Word {
        text: String,
        quoted: bool,
    },
    /// `{`, `[` or `(`; only a brace opens a body or object.
    Open {
        brace: bool,
    },
    Close,
    Assign,
    Comma,
    Newline,
    Other,
}

/// A token, its line and the position of its first char.
struct T {
    tok: Tok,
    line: usize,
    pos: usize,
}

fn lex(b: &[char]) -> Vec<T> {
    let n = b.len();
    let at = |i: usize| b.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < n {
        let (c, pos) = (b[i], i);
        let mut push = |tok, line| out.push(T { tok, line, pos });
        match c {
            '\n' => {
                push(Tok::Newline, line);
                line += 1;
                i += 1;
            }
            '#' => {
                while i < n && b[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '/' => {
                while i < n && b[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                i += 2;
                while i < n && !(b[i] == '*' && at(i + 1) == '/') {
                    if b[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += 2;
            }
            '"' => {
                let start = line;
                let mut s = String::new();
                i += 1;
                while i < n {
                    match b[i] {
                        '\\' => {
                            s.push(b[i]);
                            s.extend(b.get(i + 1));
                            i += 2;
                        }
                        '"' => {
                            i += 1;
                            break;
                        }
                        '\n' => break,
                        '$' | '%' if at(i + 1) == '{' => {
                            let mut depth = 0;
                            while i < n {
                                match b[i] {
                                    '{' => depth += 1,
                                    '}' => depth -= 1,
                                    '\n' => line += 1,
                                    _ => {}
                                }
                                i += 1;
                                if depth == 0 && b[i - 1] == '}' {
                                    break;
                                }
                            }
                        }
                        ch => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                push(
                    Tok::Word {
                        text: s,
                        quoted: true,
                    },
                    start,
                );
            }
            '<' if at(i + 1) == '<' => {
                // Heredoc: skip to the line that is its delimiter.
                i += 2;
                if at(i) == '-' {
                    i += 1;
                }
                let mut delim = String::new();
                while i < n && (b[i].is_alphanumeric() || b[i] == '_') {
                    delim.push(b[i]);
                    i += 1;
                }
                let start = line;
                loop {
                    while i < n && b[i] != '\n' {
                        i += 1;
                    }
                    if i >= n {
                        break;
                    }
                    i += 1;
                    line += 1;
                    let end = (i..n).find(|&j| b[j] == '\n').unwrap_or(n);
                    let l: String = b[i..end].iter().collect();
                    if l.trim() == delim {
                        i = end;
                        break;
                    }
                }
                push(Tok::Other, start);
            }
            '{' | '[' | '(' => {
                push(Tok::Open { brace: c == '{' }, line);
                i += 1;
            }
            '}' | ']' | ')' => {
                push(Tok::Close, line);
                i += 1;
            }
            '=' if matches!(at(i + 1), '=' | '>') => {
                push(Tok::Other, line);
                i += 2;
            }
            '=' | ':' => {
                push(Tok::Assign, line);
                i += 1;
            }
            ',' => {
                push(Tok::Comma, line);
                i += 1;
            }
            c if c.is_alphanumeric() || matches!(c, '_' | '-' | '.') => {
                let mut s = String::new();
                while i < n && (b[i].is_alphanumeric() || matches!(b[i], '_' | '-' | '.')) {
                    s.push(b[i]);
                    i += 1;
                }
                push(
                    Tok::Word {
                        text: s,
                        quoted: false,
                    },
                    line,
                );
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                push(Tok::Other, line);
                i += 1;
            }
        }
    }
    out
}

/// What a body holds, for the rewrite: nested blocks, quoted attribute keys.
#[derive(Default)]
struct Shape {
    blocks: bool,
    quoted_keys: bool,
}

/// Reads items up to the closing brace (consumed) when `nested`, or to the end. Records
/// rewrite edits for block bodies (`in_block`); object literals need none. `depth` is how many
/// braces it is inside of.
fn body_of(
    toks: &[T],
    i: &mut usize,
    nested: bool,
    in_block: bool,
    depth: usize,
    edits: &mut Vec<(usize, Edit)>,
) -> (Vec<Node>, Shape) {
    if depth >= berth_input::MAX_NESTING {
        skip_group(toks, i);
        return (Vec::new(), Shape::default());
    }
    let mut out = Vec::new();
    let mut shape = Shape::default();
    while let Some(t) = toks.get(*i) {
        match &t.tok {
            Tok::Newline => *i += 1,
            Tok::Comma => {
                if in_block {
                    edits.push((t.pos, Edit::Newline));
                }
                *i += 1;
            }
            Tok::Close => {
                *i += 1;
                if nested {
                    return (out, shape);
                }
            }
            Tok::Word { text, quoted } => {
                let (key, line) = (text.clone(), t.line);
                *i += 1;
                // Block labels.
                while let Some(T {
                    tok: Tok::Word { .. },
                    ..
                }) = toks.get(*i)
                {
                    *i += 1;
                }
                match toks.get(*i).map(|t| (&t.tok, t.pos)) {
                    Some((Tok::Open { brace: true }, open)) => {
                        let open_at = *i;
                        *i += 1;
                        let mut inner = Vec::new();
                        let (children, sub) = body_of(toks, i, true, true, depth + 1, &mut inner);
                        let close_at = *i - 1;
                        let newline = |j: usize| {
                            matches!(
                                toks.get(j),
                                Some(T {
                                    tok: Tok::Newline,
                                    ..
                                })
                            )
                        };
                        if in_block {
                            shape.blocks = true;
                            if sub.quoted_keys && !sub.blocks {
                                // An object attribute instead: quoted keys and commas are
                                // fine there.
                                edits.push((open, Edit::Insert("= ")));
                            } else {
                                edits.append(&mut inner);
                                if !newline(open_at + 1) && close_at > open_at + 1 {
                                    edits.push((open + 1, Edit::Insert("\n")));
                                }
                                if !newline(close_at - 1)
                                    && close_at > open_at + 1
                                    && let Some(T {
                                        tok: Tok::Close,
                                        pos,
                                        ..
                                    }) = toks.get(close_at)
                                {
                                    edits.push((*pos, Edit::Insert("\n")));
                                }
                            }
                        }
                        out.push(Node {
                            key,
                            line,
                            children,
                        });
                    }
                    Some((Tok::Assign, _)) => {
                        shape.quoted_keys |= *quoted;
                        *i += 1;
                        let children = match toks.get(*i) {
                            Some(T {
                                tok: Tok::Open { brace: true },
                                ..
                            }) => {
                                *i += 1;
                                body_of(toks, i, true, false, depth + 1, &mut Vec::new()).0
                            }
                            _ => {
                                skip_expr(toks, i);
                                Vec::new()
                            }
                        };
                        out.push(Node {
                            key,
                            line,
                            children,
                        });
                    }
                    _ => skip_expr(toks, i),
                }
            }
            _ => {
                *i += 1;
                skip_expr(toks, i);
            }
        }
    }
    (out, shape)
}

/// Skips to the closing bracket that matches an opening one just read (consumed), or to the end.
fn skip_group(toks: &[T], i: &mut usize) {
    let mut depth = 1usize;
    while let Some(t) = toks.get(*i) {
        *i += 1;
        match t.tok {
            Tok::Open { .. } => depth += 1,
            Tok::Close => {
                depth -= 1;
                if depth == 0 {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// Skips one expression: to the end of its line, a comma, or the closing bracket of its
/// container, whichever comes first outside nested brackets.
fn skip_expr(toks: &[T], i: &mut usize) {
    let mut depth = 0usize;
    while let Some(t) = toks.get(*i) {
        match t.tok {
            Tok::Open { .. } => depth += 1,
            Tok::Close => {
                if depth == 0 {
                    return;
                }
                depth -= 1;
            }
            Tok::Newline | Tok::Comma if depth == 0 => return,
            _ => {}
        }
        *i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(text: &str) -> String {
        Scan::new(text)
            .hcl2()
            .map(|(t, _)| t)
            .unwrap_or_else(|| text.to_string())
    }

    #[test]
    fn hcl2_text_is_left_alone() {
        let text = "a = 1\nb {\n  c = \"x,y\"\n  d = { e = 1, f = 2 }\n}\n";
        assert!(Scan::new(text).hcl2().is_none());
    }

    #[test]
    fn nomad_hcl1_forms_become_hcl2() {
        let text = r#"topology_request {
  required {
    topology { segments { rack = "R1" } }
    topology { segments { "rack" = "R2", "topology.x.io/zone" = "us-east-1a" } }
    topology { segments { rack = "R2", zone = "z" } }
  }
}
capability { access_mode = "a", attachment_mode = "b" }
"#;
        let out = rewrite(text);
        let body = hcl::parse(&out).unwrap_or_else(|e| panic!("{out}\n{e}"));
        let v = body_to_json(&body, &FieldPath::root()).unwrap();
        let topo = &v["topology_request"]["required"]["topology"];
        assert_eq!(topo[0]["segments"]["rack"], "R1");
        assert_eq!(topo[1]["segments"]["topology.x.io/zone"], "us-east-1a");
        assert_eq!(topo[2]["segments"]["zone"], "z");
        assert_eq!(v["capability"]["attachment_mode"], "b");

        // Each rewritten line knows its original line.
        let (out, lines) = Scan::new(text).hcl2().unwrap();
        assert_eq!(out.lines().count(), lines.len() - 1);
        for (l, orig) in out.lines().zip(&lines) {
            if l.contains("R2") {
                assert!([4, 5].contains(orig), "{l:?} at {orig}");
            }
            if l.contains("attachment_mode") {
                assert_eq!(*orig, 8);
            }
        }
    }

    #[test]
    fn the_outline_stops_at_the_nesting_limit() {
        // The depth check reads the blocks as a comment inside an interpolation; this lenient
        // reading sees them as code. It must not recurse once per block.
        let n = 200_000;
        let text = format!(
            "x = \"${{ /* }}\"\n{}{} */ }}\"\n",
            "a{".repeat(n),
            "}".repeat(n)
        );
        let depth = berth_testkit::on_small_stack(move || {
            let scan = Scan::new(&text);
            let depth = {
                let (mut nodes, mut depth) = (&scan.outline[..], 0);
                while let Some(n) = nodes.iter().find(|n| n.key == "a") {
                    nodes = &n.children;
                    depth += 1;
                }
                depth
            };
            // Dropping the outline recurses too: bounded as well.
            drop(scan);
            depth
        });
        assert_eq!(depth, berth_input::MAX_NESTING);
    }

    #[test]
    fn outline_follows_the_original_lines() {
        let text = "a = 1\n\nb {\n  c { d = 1 }\n  c {\n    d = { e = \"}\" }\n  }\n}\n";
        let scan = Scan::new(text);
        let p = FieldPath::root().key("b").key("c").at(1).key("d").key("e");
        assert_eq!(line_of(&scan.outline, &p), Some(6));
        let p = FieldPath::root().key("b").key("c").key("d");
        assert_eq!(line_of(&scan.outline, &p), Some(4));
        let p = FieldPath::root().key("b").key("nope");
        assert_eq!(line_of(&scan.outline, &p), Some(3));
        assert_eq!(line_of(&scan.outline, &FieldPath::root().key("x")), None);
    }
}
