use serde_json::json;

use super::*;
use crate::proto::hclspec as pb;

fn spec(block: Block) -> Spec {
    Spec { block: Some(block) }
}

fn attr(name: &str, ty: &str, required: bool) -> Spec {
    spec(Block::Attr(pb::Attr {
        name: name.into(),
        r#type: ty.into(),
        required,
    }))
}

fn literal(value: &str) -> Spec {
    spec(Block::Literal(pb::Literal {
        value: value.into(),
    }))
}

fn default(primary: Spec, fallback: Spec) -> Spec {
    spec(Block::Default(Box::new(pb::Default {
        primary: Some(Box::new(primary)),
        default: Some(Box::new(fallback)),
    })))
}

fn object(attrs: Vec<(&str, Spec)>) -> Spec {
    spec(Block::Object(pb::Object {
        attributes: attrs.into_iter().map(|(k, s)| (k.to_string(), s)).collect(),
    }))
}

fn block(name: &str, required: bool, nested: Spec) -> Spec {
    spec(Block::BlockValue(Box::new(pb::Block {
        name: name.into(),
        required,
        nested: Some(Box::new(nested)),
    })))
}

fn block_list(name: &str, min: u64, max: u64, nested: Spec) -> Spec {
    spec(Block::BlockList(Box::new(pb::BlockList {
        name: name.into(),
        min_items: min,
        max_items: max,
        nested: Some(Box::new(nested)),
    })))
}

fn block_set(name: &str, nested: Spec) -> Spec {
    spec(Block::BlockSet(Box::new(pb::BlockSet {
        name: name.into(),
        min_items: 0,
        max_items: 0,
        nested: Some(Box::new(nested)),
    })))
}

fn block_map(name: &str, labels: &[&str], nested: Spec) -> Spec {
    spec(Block::BlockMap(Box::new(pb::BlockMap {
        name: name.into(),
        labels: labels.iter().map(|l| (*l).to_string()).collect(),
        nested: Some(Box::new(nested)),
    })))
}

fn block_attrs(name: &str, ty: &str, required: bool) -> Spec {
    spec(Block::BlockAttrs(pb::BlockAttrs {
        name: name.into(),
        r#type: ty.into(),
        required,
    }))
}

/// The schema of Nomad's example device plugin (files in a directory as devices).
fn example_schema() -> Spec {
    object(vec![
        (
            "dir",
            default(attr("dir", "string", false), literal("\".\"")),
        ),
        (
            "list_period",
            default(attr("list_period", "string", false), literal("\"5s\"")),
        ),
        (
            "unhealthy_perm",
            default(
                attr("unhealthy_perm", "string", false),
                literal("\"-rwxrwxrwx\""),
            ),
        ),
    ])
}

fn apply_ok(spec: &Spec, config: serde_json::Value) -> serde_json::Value {
    apply("p", Some(spec), &config)
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("a value")
        .to_json()
}

fn apply_err(spec: &Spec, config: serde_json::Value) -> String {
    apply("p", Some(spec), &config).unwrap_err().to_string()
}

#[test]
fn the_example_schema_fills_in_defaults() {
    let s = example_schema();
    let all = json!({"dir": ".", "list_period": "5s", "unhealthy_perm": "-rwxrwxrwx"});
    assert_eq!(apply_ok(&s, serde_json::Value::Null), all);
    assert_eq!(apply_ok(&s, json!({})), all);
    assert_eq!(
        apply_ok(&s, json!({"dir": "/dev/x", "list_period": null})),
        json!({"dir": "/dev/x", "list_period": "5s", "unhealthy_perm": "-rwxrwxrwx"})
    );
    // A number where a string is declared is converted, as HCL does.
    assert_eq!(apply_ok(&s, json!({"dir": 5}))["dir"], json!("5"));
}

#[test]
fn unknown_keys_and_wrong_types_name_the_field() {
    let s = example_schema();
    assert_eq!(
        apply_err(&s, json!({"dri": "/x"})),
        "plugin \"p\".config.dri: unsupported argument: the plugin's schema has no such \
         attribute or block (it takes: dir, list_period, unhealthy_perm)"
    );
    assert_eq!(
        apply_err(&s, json!({"dir": ["/x"]})),
        "plugin \"p\".config.dir: a string is required, not a list"
    );
    assert_eq!(
        apply_err(&s, json!("dir")),
        "plugin \"p\".config: must be an object (the plugin's config block), not a string"
    );
}

#[test]
fn typed_attributes_and_required() {
    let s = object(vec![
        ("count", attr("count", "number", true)),
        ("on", default(attr("on", "bool", false), literal("false"))),
        ("tags", attr("tags", "list(string)", false)),
        (
            "labels",
            default(attr("labels", "map(string)", false), literal("{}")),
        ),
        ("ratio", attr("ratio", "number", false)),
        ("anything", attr("anything", "any", false)),
        ("pair", attr("pair", "tuple([string, number])", false)),
        (
            "obj",
            attr("obj", "object({a = number, b = list(bool)})", false),
        ),
    ]);
    assert_eq!(
        apply_ok(
            &s,
            json!({
                "count": "3", "tags": ["a", 1], "ratio": 0.5, "anything": {"x": [1]},
                "pair": ["x", "2"], "obj": {"a": 1, "b": ["true", false]}
            })
        ),
        json!({
            "count": 3, "on": false, "tags": ["a", "1"], "labels": {}, "ratio": 0.5,
            "anything": {"x": [1]}, "pair": ["x", 2], "obj": {"a": 1, "b": [true, false]}
        })
    );
    assert_eq!(
        apply_err(&s, json!({})),
        "plugin \"p\".config.count: missing required argument"
    );
    assert_eq!(
        apply_err(&s, json!({"count": 1, "tags": ["a", ["b"]]})),
        "plugin \"p\".config.tags[1]: a string is required, not a list"
    );
    assert_eq!(
        apply_err(&s, json!({"count": 1, "on": "yes"})),
        "plugin \"p\".config.on: a bool is required; the string given is not true or false"
    );
    assert_eq!(
        apply_err(&s, json!({"count": 1, "obj": {"a": 1, "b": [], "c": 2}})),
        "plugin \"p\".config.obj.c: unsupported attribute: object({a = number, b = list(bool)}) \
         has no attribute \"c\""
    );
    assert_eq!(
        apply_err(&s, json!({"count": 1, "labels": {"a b": []}})),
        "plugin \"p\".config.labels[\"a b\"]: a string is required, not a list"
    );
}

#[test]
fn nested_blocks() {
    let server = object(vec![
        ("address", attr("address", "string", true)),
        (
            "port",
            default(attr("port", "number", false), literal("8080")),
        ),
    ]);
    let s = object(vec![
        ("name", attr("name", "string", false)),
        ("server", block("server", true, server.clone())),
        ("replica", block_list("replica", 1, 2, server.clone())),
        ("zones", block_set("zone", attr("id", "string", true))),
        (
            "env",
            block_map(
                "env",
                &["kind", "name"],
                object(vec![("v", attr("v", "string", true))]),
            ),
        ),
        ("vars", block_attrs("vars", "number", false)),
    ]);
    let config = json!({
        "server": {"address": "a"},
        "replica": [{"address": "m1", "port": 1}, {"address": "m2"}],
        "zone": [{"id": "z"}, {"id": "z"}, {"id": "y"}],
        "env": {"prod": {"db": {"v": "1"}}, "dev": {"db": [{"v": "2"}]}},
        "vars": {"x": "1", "y": 2.5}
    });
    assert_eq!(
        apply_ok(&s, config),
        json!({
            "name": null,
            "server": {"address": "a", "port": 8080},
            "replica": [{"address": "m1", "port": 1}, {"address": "m2", "port": 8080}],
            "zones": ["z", "y"],
            "env": {"dev": {"db": {"v": "2"}}, "prod": {"db": {"v": "1"}}},
            "vars": {"x": 1, "y": 2.5}
        })
    );
    let minimal = json!({"server": {"address": "a"}, "replica": {"address": "m"}});
    let out = apply_ok(&s, minimal.clone());
    assert_eq!(out["replica"], json!([{"address": "m", "port": 8080}]));
    assert_eq!(out["env"], json!({}));
    assert_eq!(out["vars"], json!(null));
    assert_eq!(out["zones"], json!([]));

    let with = |k: &str, v: serde_json::Value| {
        let mut c = minimal.clone();
        c[k] = v;
        apply_err(&s, c)
    };
    assert_eq!(
        apply_err(&s, json!({"replica": {"address": "m"}})),
        "plugin \"p\".config.server: a server block is required"
    );
    assert_eq!(
        with("server", json!({"address": "a", "bogus": 1})),
        "plugin \"p\".config.server.bogus: unsupported argument: the plugin's schema has no \
         such attribute or block (it takes: address, port)"
    );
    assert_eq!(
        with("server", json!([{"address": "a"}, {"address": "b"}])),
        "plugin \"p\".config.server: only one server block is allowed, found 2"
    );
    assert_eq!(
        with("server", json!("a")),
        "plugin \"p\".config.server: must be a block (an object), not a string"
    );
    assert_eq!(
        with("replica", json!([])),
        "plugin \"p\".config.replica: at least 1 replica block(s) are required, found 0"
    );
    assert_eq!(
        with(
            "replica",
            json!([{"address": "1"}, {"address": "2"}, {"address": "3"}])
        ),
        "plugin \"p\".config.replica: at most 2 replica block(s) are allowed, found 3"
    );
    assert_eq!(
        with("replica", json!([{"address": "1"}, {"port": 2}])),
        "plugin \"p\".config.replica[1].address: missing required argument"
    );
    assert_eq!(
        with("env", json!({"prod": "x"})),
        "plugin \"p\".config.env.prod: must be an object keyed by the block's \"name\" label, \
         not a string"
    );
    assert_eq!(
        with("env", json!({"prod": {"db": {"w": "1"}}})),
        "plugin \"p\".config.env.prod.db.w: unsupported argument: the plugin's schema has no \
         such attribute or block (it takes: v)"
    );
    assert_eq!(
        with("vars", json!({"x": "one"})),
        "plugin \"p\".config.vars.x: a number is required; the string given is not a number"
    );
}

#[test]
fn arrays_and_literals() {
    let s = object(vec![(
        "pair",
        spec(Block::Array(pb::Array {
            values: vec![attr("first", "string", false), literal("[1, \"two\"]")],
        })),
    )]);
    assert_eq!(
        apply_ok(&s, json!({"first": "a"})),
        json!({"pair": ["a", [1, "two"]]})
    );
}

#[test]
fn a_broken_schema_is_the_plugins_fault() {
    let bad_type = object(vec![("x", attr("x", "strng", false))]);
    let err = apply_err(&bad_type, json!({}));
    assert!(
        err.starts_with(
            "plugin \"p\" sent an unusable config schema (at config.x): type expression \"strng\""
        ),
        "{err}"
    );
    let bad_literal = object(vec![(
        "x",
        default(attr("x", "string", false), literal("\"open")),
    )]);
    let err = apply_err(&bad_literal, json!({}));
    assert!(err.contains("is not an HCL expression"), "{err}");
    let unnamed = spec(Block::Attr(pb::Attr {
        name: String::new(),
        r#type: "string".into(),
        required: false,
    }));
    assert!(apply_err(&unnamed, json!({})).contains("Attr spec without a name"));
    let empty_block = object(vec![("b", spec(Block::BlockValue(Box::default())))]);
    assert!(apply_err(&empty_block, json!({})).contains("block spec without a nested spec"));
}

#[test]
fn no_schema_takes_no_config() {
    assert_eq!(apply("p", None, &json!({})), Ok(None));
    assert_eq!(apply("p", None, &serde_json::Value::Null), Ok(None));
    assert_eq!(
        apply("p", None, &json!({"a": 1})).unwrap_err().to_string(),
        "plugin \"p\".config: the plugin takes no configuration (its ConfigSchema is empty)"
    );
}

#[test]
fn config_values_never_show_in_errors() {
    // A plugin's config may hold credentials: whatever the user wrote where another type was
    // expected, the error names the field, never the value.
    const CANARY: &str = "s3cr3t-t0ken-4471";
    let s = object(vec![
        ("port", attr("port", "number", false)),
        ("tls", attr("tls", "bool", false)),
        ("hosts", attr("hosts", "list(number)", false)),
        ("labels", attr("labels", "map(bool)", false)),
    ]);
    for config in [
        json!({"port": CANARY}),
        json!({"tls": CANARY}),
        json!({"hosts": [1, CANARY]}),
        json!({"labels": {"a": CANARY}}),
        json!({"port": [CANARY]}),
        json!({"port": {"x": CANARY}}),
    ] {
        let e = apply_err(&s, config.clone());
        assert!(!e.contains(CANARY), "{config}: {e}");
        assert!(e.starts_with("plugin \"p\".config."), "{config}: {e}");
    }
}
