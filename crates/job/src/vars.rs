//! HCL2 evaluation at parse time: `variable`, `variables` and `locals` blocks, values from
//! `-var` and `-var-file`, and the functions a spec may call.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use berth_input::Quoted;
use berth_volume::SpecError;
use hcl::{
    Map, Value,
    edit::{
        Span as _,
        structure::{Body, Structure},
    },
    eval::{Context, Evaluate as _, FuncArgs, FuncDef, ParamType},
};

use crate::input::Lines;

/// A `-var-file`: its name (for errors) and text (HCL assignments, or a JSON object when the
/// name ends in `.json`).
#[derive(Debug, Clone)]
pub struct VarFile {
    /// The name errors use.
    pub name: PathBuf,
    /// Its text.
    pub text: String,
}

/// A declared type, as far as berth checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Any,
    String,
    Number,
    Bool,
    List,
    Map,
}

impl Ty {
    fn of(e: &hcl::Expression) -> Option<Ty> {
        let name = match e {
            hcl::Expression::Variable(v) => v.as_str().to_owned(),
            hcl::Expression::FuncCall(f) => f.name.to_string(),
            _ => return None,
        };
        Some(match name.as_str() {
            "any" => Ty::Any,
            "string" => Ty::String,
            "number" => Ty::Number,
            "bool" => Ty::Bool,
            "list" | "set" | "tuple" => Ty::List,
            "map" | "object" => Ty::Map,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Ty::Any => "any",
            Ty::String => "string",
            Ty::Number => "number",
            Ty::Bool => "bool",
            Ty::List => "a list",
            Ty::Map => "a map",
        }
    }

    /// `v` converted to this type as HCL converts, or `None`.
    fn convert(self, v: Value) -> Option<Value> {
        match (self, v) {
            (Ty::Any, v) => Some(v),
            (Ty::String, Value::String(s)) => Some(Value::String(s)),
            (Ty::String, Value::Number(n)) => Some(Value::String(n.to_string())),
            (Ty::String, Value::Bool(b)) => Some(Value::String(b.to_string())),
            (Ty::Number, Value::Number(n)) => Some(Value::Number(n)),
            (Ty::Number, Value::String(s)) => s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(hcl::Number::from_f64)
                .map(|n| match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
                    _ => Value::Number(n),
                }),
            (Ty::Bool, Value::Bool(b)) => Some(Value::Bool(b)),
            (Ty::Bool, Value::String(s)) if s == "true" || s == "false" => {
                Some(Value::Bool(s == "true"))
            }
            (Ty::List, Value::Array(a)) => Some(Value::Array(a)),
            (Ty::Map, Value::Object(o)) => Some(Value::Object(o)),
            _ => None,
        }
    }
}

struct Decl {
    ty: Ty,
    value: Option<Value>,
    line: Option<usize>,
}

/// The evaluation context of a spec: `var`, `local` and the functions.
pub(crate) struct Eval {
    pub ctx: Context<'static>,
}

impl Eval {
    /// A context with the functions only (JSON specs, and tests).
    pub fn bare() -> Self {
        let mut ctx = Context::new();
        declare_functions(&mut ctx);
        Self { ctx }
    }
}

/// What the caller gives: `-var` values and var files.
pub(crate) struct Inputs<'a> {
    pub vars: &'a [(String, String)],
    pub var_files: &'a [VarFile],
}

/// Reads the `variable`, `variables` and `locals` blocks of `body` and applies `inputs`; every
/// problem is returned.
pub(crate) fn context(
    file: &Path,
    body: &Body,
    lines: &Lines,
    inputs: &Inputs<'_>,
) -> Result<Eval, Vec<SpecError>> {
    let mut errors = Vec::new();
    let err = |file: &Path, line: Option<usize>, field: String, message: String| SpecError {
        file: file.to_path_buf(),
        line,
        field,
        message,
    };
    let bare = Eval::bare();
    let mut decls: BTreeMap<String, Decl> = BTreeMap::new();
    let mut locals: Vec<(String, hcl::Expression, Option<usize>)> = Vec::new();
    for s in body.iter() {
        let Structure::Block(b) = s else { continue };
        let line = lines.of(b.span().map(|r| r.start));
        match b.ident.as_str() {
            "variable" => {
                let Some(name) = b.labels.first().map(|l| l.as_str().to_owned()) else {
                    errors.push(err(
                        file,
                        line,
                        "variable".into(),
                        "needs a name: variable \"<name>\" { … }".into(),
                    ));
                    continue;
                };
                let field = format!("variable[{name}]");
                let mut decl = Decl {
                    ty: Ty::Any,
                    value: None,
                    line,
                };
                let mut typed = false;
                for a in b.body.attributes() {
                    let at = lines.of(a.span().map(|r| r.start)).or(line);
                    let e = hcl::Expression::from(a.value.clone());
                    match a.key.as_str() {
                        "type" => match Ty::of(&e) {
                            Some(t) => {
                                decl.ty = t;
                                typed = true;
                            }
                            None => errors.push(err(file, at, format!("{field}.type"), "unknown type (expected string, number, bool, list(…), set(…), map(…), object(…) or any)".into())),
                        },
                        "default" => match e.evaluate(&bare.ctx) {
                            Ok(v) => decl.value = Some(v),
                            Err(e) => errors.push(err(file, at, format!("{field}.default"), one_line(&e.to_string()))),
                        },
                        "description" | "sensitive" | "nullable" => {}
                        other => errors.push(err(file, at, format!("{field}.{other}"), "unknown field; expected one of: type, default, description, sensitive, nullable".into())),
                    }
                }
                if b.body.blocks().next().is_some() {
                    errors.push(err(
                        file,
                        line,
                        field.clone(),
                        "validation blocks are not read by berth".into(),
                    ));
                }
                // Only a typed default is converted (an untyped one is kept as it is).
                if let Some(v) = decl.value.take_if(|_| typed) {
                    match decl.ty.convert(v) {
                        Some(v) => decl.value = Some(v),
                        None => errors.push(err(
                            file,
                            line,
                            format!("{field}.default"),
                            format!("is not {}", decl.ty.name()),
                        )),
                    }
                }
                if decls.insert(name.clone(), decl).is_some() {
                    errors.push(err(file, line, field, "declared more than once".into()));
                }
            }
            "variables" => {
                for a in b.body.attributes() {
                    let at = lines.of(a.span().map(|r| r.start)).or(line);
                    let e = hcl::Expression::from(a.value.clone());
                    match e.evaluate(&bare.ctx) {
                        Ok(v) => {
                            decls.insert(
                                a.key.to_string(),
                                Decl {
                                    ty: Ty::Any,
                                    value: Some(v),
                                    line: at,
                                },
                            );
                        }
                        Err(e) => errors.push(err(
                            file,
                            at,
                            format!("variables.{}", a.key.as_str()),
                            one_line(&e.to_string()),
                        )),
                    }
                }
            }
            "locals" => {
                for a in b.body.attributes() {
                    let at = lines.of(a.span().map(|r| r.start)).or(line);
                    locals.push((
                        a.key.to_string(),
                        hcl::Expression::from(a.value.clone()),
                        at,
                    ));
                }
            }
            _ => {}
        }
    }

    // Var files, then -var: later wins.
    for f in inputs.var_files {
        match var_file(f, &bare) {
            Ok(values) => {
                for (name, value, line) in values {
                    set(&mut decls, &name, value, &mut errors, || {
                        (f.name.clone(), line, name.clone())
                    });
                }
            }
            Err(e) => errors.push(e),
        }
    }
    for (name, raw) in inputs.vars {
        let Some(decl) = decls.get(name) else {
            errors.push(err(
                Path::new("-var"),
                None,
                name.clone(),
                format!("variable {} is not declared in the spec", Quoted(name)),
            ));
            continue;
        };
        let value = if matches!(decl.ty, Ty::String | Ty::Any) {
            Value::String(raw.clone())
        } else {
            match parse_value(raw, &bare) {
                Some(v) => v,
                None => Value::String(raw.clone()),
            }
        };
        set(&mut decls, name, value, &mut errors, || {
            (PathBuf::from("-var"), None, name.clone())
        });
    }

    let mut var = Map::new();
    for (name, d) in &decls {
        match &d.value {
            Some(v) => {
                var.insert(name.clone(), v.clone());
            }
            None => errors.push(err(
                file,
                d.line,
                format!("variable[{name}]"),
                format!(
                    "variable {} has no value: give it a default, -var {name}=…, or a -var-file",
                    Quoted(name)
                ),
            )),
        }
    }

    let mut eval = Eval::bare();
    eval.ctx.declare_var("var", Value::Object(var));
    let mut local = Map::new();
    let mut pending = locals;
    loop {
        eval.ctx.declare_var("local", Value::Object(local.clone()));
        let before = pending.len();
        let mut left = Vec::new();
        let mut last_errors = Vec::new();
        for (name, e, line) in pending {
            match e.evaluate(&eval.ctx) {
                Ok(v) => {
                    local.insert(name, v);
                }
                Err(x) => {
                    last_errors.push(err(
                        file,
                        line,
                        format!("locals.{name}"),
                        one_line(&x.to_string()),
                    ));
                    left.push((name, e, line));
                }
            }
        }
        if left.is_empty() {
            eval.ctx.declare_var("local", Value::Object(local.clone()));
            break;
        }
        if left.len() == before {
            errors.extend(last_errors);
            break;
        }
        pending = left;
    }
    if errors.is_empty() {
        Ok(eval)
    } else {
        Err(errors)
    }
}

fn set(
    decls: &mut BTreeMap<String, Decl>,
    name: &str,
    value: Value,
    errors: &mut Vec<SpecError>,
    at: impl Fn() -> (PathBuf, Option<usize>, String),
) {
    let (file, line, field) = at();
    let Some(decl) = decls.get_mut(name) else {
        errors.push(SpecError {
            file,
            line,
            field,
            message: format!("variable {} is not declared in the spec", Quoted(name)),
        });
        return;
    };
    match decl.ty.convert(value) {
        Some(v) => decl.value = Some(v),
        None => errors.push(SpecError {
            file,
            line,
            field,
            message: format!("variable {} must be {}", Quoted(name), decl.ty.name()),
        }),
    }
}

/// A `-var` value of a variable that is not a string: an HCL expression.
fn parse_value(raw: &str, bare: &Eval) -> Option<Value> {
    let body = hcl::edit::parser::parse_body(&format!("v = {raw}\n")).ok()?;
    let a = body.attributes().next()?;
    hcl::Expression::from(a.value.clone())
        .evaluate(&bare.ctx)
        .ok()
}

/// The assignments of a var file, with their lines.
fn var_file(f: &VarFile, bare: &Eval) -> Result<Vec<(String, Value, Option<usize>)>, SpecError> {
    let err = |line: Option<usize>, message: String| SpecError {
        file: f.name.clone(),
        line,
        field: String::new(),
        message,
    };
    berth_input::check_text(berth_input::Syntax::Hcl, &f.text)
        .map_err(|e| err(e.line(), e.to_string()))?;
    if f.name.extension().is_some_and(|e| e == "json") {
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&f.text)
            .map_err(|e| err(Some(e.line()).filter(|l| *l > 0), e.to_string()))?;
        return Ok(v
            .into_iter()
            .map(|(k, v)| (k, hcl::to_value(v).unwrap_or(Value::Null), None))
            .collect());
    }
    let body = hcl::edit::parser::parse_body(&f.text).map_err(|e| {
        let at = e.location();
        err(
            Some(at.line()),
            format!("column {}: {}", at.column(), e.message()),
        )
    })?;
    let lines = Lines::new(&f.text);
    let mut out = Vec::new();
    if let Some(b) = body.blocks().next() {
        return Err(err(
            lines.of(b.span().map(|r| r.start)),
            "a var file holds `name = value` lines only".into(),
        ));
    }
    for a in body.attributes() {
        let line = lines.of(a.span().map(|r| r.start));
        let v = hcl::Expression::from(a.value.clone())
            .evaluate(&bare.ctx)
            .map_err(|e| err(line, one_line(&e.to_string())))?;
        out.push((a.key.to_string(), v, line));
    }
    Ok(out)
}

pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text a value interpolates to; `None` for lists and maps.
pub(crate) fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some(String::new()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn num(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| "not a number".into()),
        _ => Err("expected a number".into()),
    }
}

fn number(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Value::from(f as i64)
    } else {
        hcl::Number::from_f64(f).map_or(Value::Null, Value::Number)
    }
}

fn string(v: &Value) -> Result<String, String> {
    as_text(v).ok_or_else(|| "expected a string".into())
}

fn declare_functions(ctx: &mut Context<'static>) {
    use ParamType as P;
    let f1 = |p: P, f: fn(FuncArgs) -> Result<Value, String>| FuncDef::builder().param(p).build(f);
    ctx.declare_func(
        "upper",
        f1(P::String, |a| {
            Ok(Value::String(string(&a[0])?.to_uppercase()))
        }),
    );
    ctx.declare_func(
        "lower",
        f1(P::String, |a| {
            Ok(Value::String(string(&a[0])?.to_lowercase()))
        }),
    );
    ctx.declare_func(
        "trimspace",
        f1(P::String, |a| {
            Ok(Value::String(string(&a[0])?.trim().to_owned()))
        }),
    );
    ctx.declare_func(
        "title",
        f1(P::String, |a| {
            let s = string(&a[0])?;
            let mut out = String::new();
            let mut start = true;
            for c in s.chars() {
                if start {
                    out.extend(c.to_uppercase())
                } else {
                    out.push(c)
                }
                start = c.is_whitespace();
            }
            Ok(Value::String(out))
        }),
    );
    ctx.declare_func(
        "tostring",
        f1(P::Any, |a| Ok(Value::String(string(&a[0])?))),
    );
    ctx.declare_func(
        "tonumber",
        f1(P::Any, |a| {
            Ty::Number
                .convert(a[0].clone())
                .ok_or_else(|| "cannot convert to a number".into())
        }),
    );
    ctx.declare_func(
        "tobool",
        f1(P::Any, |a| {
            Ty::Bool
                .convert(a[0].clone())
                .ok_or_else(|| "cannot convert to a bool".into())
        }),
    );
    ctx.declare_func("abs", f1(P::Number, |a| Ok(number(num(&a[0])?.abs()))));
    ctx.declare_func(
        "length",
        f1(P::Any, |a| {
            Ok(Value::from(match &a[0] {
                Value::String(s) => s.chars().count(),
                Value::Array(v) => v.len(),
                Value::Object(o) => o.len(),
                _ => return Err("expected a string, list or map".into()),
            } as u64))
        }),
    );
    ctx.declare_func(
        "keys",
        f1(P::object_of(P::Any), |a| match &a[0] {
            Value::Object(o) => Ok(Value::Array(
                o.keys().map(|k| Value::String(k.clone())).collect(),
            )),
            _ => Err("expected a map".into()),
        }),
    );
    ctx.declare_func(
        "values",
        f1(P::object_of(P::Any), |a| match &a[0] {
            Value::Object(o) => Ok(Value::Array(o.values().cloned().collect())),
            _ => Err("expected a map".into()),
        }),
    );
    ctx.declare_func(
        "jsonencode",
        f1(P::Any, |a| {
            serde_json::to_string(&a[0])
                .map(Value::String)
                .map_err(|e| e.to_string())
        }),
    );
    ctx.declare_func(
        "join",
        FuncDef::builder()
            .param(P::String)
            .param(P::array_of(P::Any))
            .build(|a| {
                let sep = string(&a[0])?;
                let Value::Array(items) = &a[1] else {
                    return Err("expected a list".into());
                };
                let items: Result<Vec<String>, String> = items.iter().map(string).collect();
                Ok(Value::String(items?.join(&sep)))
            }),
    );
    ctx.declare_func(
        "split",
        FuncDef::builder()
            .param(P::String)
            .param(P::String)
            .build(|a| {
                let sep = string(&a[0])?;
                let s = string(&a[1])?;
                Ok(Value::Array(
                    s.split(sep.as_str())
                        .map(|p| Value::String(p.to_owned()))
                        .collect(),
                ))
            }),
    );
    ctx.declare_func(
        "replace",
        FuncDef::builder()
            .params([P::String, P::String, P::String])
            .build(|a| {
                Ok(Value::String(
                    string(&a[0])?.replace(&string(&a[1])?, &string(&a[2])?),
                ))
            }),
    );
    ctx.declare_func(
        "substr",
        FuncDef::builder()
            .params([P::String, P::Number, P::Number])
            .build(|a| {
                let s: Vec<char> = string(&a[0])?.chars().collect();
                let off = num(&a[1])? as i64;
                let len = num(&a[2])? as i64;
                let start = if off < 0 {
                    (s.len() as i64 + off).max(0)
                } else {
                    off.min(s.len() as i64)
                } as usize;
                let end = if len < 0 {
                    s.len()
                } else {
                    (start + len as usize).min(s.len())
                };
                Ok(Value::String(s[start..end].iter().collect()))
            }),
    );
    ctx.declare_func(
        "contains",
        FuncDef::builder()
            .param(P::array_of(P::Any))
            .param(P::Any)
            .build(|a| {
                let Value::Array(items) = &a[0] else {
                    return Err("expected a list".into());
                };
                Ok(Value::Bool(items.contains(&a[1])))
            }),
    );
    ctx.declare_func(
        "lookup",
        FuncDef::builder()
            .param(P::object_of(P::Any))
            .param(P::String)
            .variadic_param(P::Any)
            .build(|a| {
                let Value::Object(o) = &a[0] else {
                    return Err("expected a map".into());
                };
                let key = string(&a[1])?;
                o.get(&key)
                    .cloned()
                    .or_else(|| a.get(2).cloned())
                    .ok_or_else(|| format!("no key {key:?} and no default"))
            }),
    );
    ctx.declare_func(
        "concat",
        FuncDef::builder()
            .variadic_param(P::array_of(P::Any))
            .build(|a| {
                let mut out = Vec::new();
                for v in a.iter() {
                    let Value::Array(items) = v else {
                        return Err("expected lists".into());
                    };
                    out.extend(items.iter().cloned());
                }
                Ok(Value::Array(out))
            }),
    );
    ctx.declare_func(
        "merge",
        FuncDef::builder()
            .variadic_param(P::object_of(P::Any))
            .build(|a| {
                let mut out = Map::new();
                for v in a.iter() {
                    let Value::Object(o) = v else {
                        return Err("expected maps".into());
                    };
                    out.extend(o.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                Ok(Value::Object(out))
            }),
    );
    ctx.declare_func(
        "coalesce",
        FuncDef::builder().variadic_param(P::Any).build(|a| {
            a.iter()
                .find(|v| !matches!(v, Value::Null) && *v != &Value::String(String::new()))
                .cloned()
                .ok_or_else(|| "no non-empty argument".into())
        }),
    );
    ctx.declare_func(
        "min",
        FuncDef::builder().variadic_param(P::Number).build(|a| {
            a.iter()
                .map(num)
                .try_fold(f64::INFINITY, |m, x| x.map(|x| m.min(x)))
                .map(number)
        }),
    );
    ctx.declare_func(
        "max",
        FuncDef::builder().variadic_param(P::Number).build(|a| {
            a.iter()
                .map(num)
                .try_fold(f64::NEG_INFINITY, |m, x| x.map(|x| m.max(x)))
                .map(number)
        }),
    );
    ctx.declare_func(
        "range",
        FuncDef::builder().variadic_param(P::Number).build(|a| {
            let n: Vec<f64> = a.iter().map(num).collect::<Result<_, _>>()?;
            let (start, end, step) = match n.as_slice() {
                [e] => (0.0, *e, 1.0),
                [s, e] => (*s, *e, 1.0),
                [s, e, st] => (*s, *e, *st),
                _ => return Err("range takes 1 to 3 numbers".into()),
            };
            if step == 0.0 {
                return Err("step must not be 0".into());
            }
            let mut out = Vec::new();
            let mut x = start;
            while (step > 0.0 && x < end) || (step < 0.0 && x > end) {
                out.push(number(x));
                x += step;
                if out.len() > 1024 {
                    return Err("more than 1024 numbers".into());
                }
            }
            Ok(Value::Array(out))
        }),
    );
    ctx.declare_func(
        "format",
        FuncDef::builder()
            .param(P::String)
            .variadic_param(P::Any)
            .build(|a| {
                let f = string(&a[0])?;
                let mut args = a.iter().skip(1);
                let mut out = String::new();
                let mut chars = f.chars().peekable();
                while let Some(c) = chars.next() {
                    if c != '%' {
                        out.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('%') => out.push('%'),
                        Some('s' | 'v' | 'd' | 'q') => {
                            let v = args.next().ok_or("not enough arguments")?;
                            out.push_str(&string(v).or_else(|_| {
                                serde_json::to_string(v).map_err(|e| e.to_string())
                            })?);
                        }
                        _ => return Err("format supports %s, %d, %v, %q and %%".into()),
                    }
                }
                Ok(Value::String(out))
            }),
    );
}

/// Names of a set, for messages.
pub(crate) fn listed(set: &BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(", ")
}
