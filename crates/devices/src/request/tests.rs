use std::collections::BTreeMap;

use super::*;
use crate::{
    attribute::Attribute,
    model::{DeviceGroup, DeviceInstance},
};

fn group(vendor: &str, ty: &str, name: &str, attrs: &[(&str, Attribute)]) -> DeviceGroup {
    DeviceGroup {
        vendor: vendor.into(),
        device_type: ty.into(),
        name: name.into(),
        attributes: attrs
            .iter()
            .map(|(k, v)| ((*k).to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
        instances: ["GPU-0", "GPU-1"]
            .iter()
            .map(|id| DeviceInstance {
                id: (*id).into(),
                healthy: true,
                health_description: String::new(),
                locality: None,
            })
            .collect(),
    }
}

fn k80(memory: &str) -> DeviceGroup {
    group(
        "nvidia",
        "gpu",
        "Tesla K80",
        &[
            ("memory", Attribute::parse(memory)),
            ("cuda_cores", Attribute::int(4992, "")),
            ("driver_version", Attribute::string("470.57.02")),
            ("features", Attribute::string("fp16, fp32,tensor")),
            ("ecc", Attribute::bool(true)),
            ("clock", Attribute::float(1.5, "GHz")),
            ("power", Attribute::int(300, "W")),
            ("compute", Attribute::string("7.5")),
        ],
    )
}

fn constraint(attribute: &str, operator: &str, value: &str) -> ConstraintInput {
    ConstraintInput {
        attribute: attribute.into(),
        operator: Some(operator.into()),
        value: value.into(),
    }
}

fn affinity(attribute: &str, operator: &str, value: &str, weight: i64) -> AffinityInput {
    AffinityInput {
        attribute: attribute.into(),
        operator: Some(operator.into()),
        value: value.into(),
        weight: Some(weight),
    }
}

fn request(name: &str, constraints: Vec<ConstraintInput>) -> DeviceRequest {
    DeviceRequest::build(&RequestInput {
        name: name.into(),
        constraints,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e:?}"))
}

/// Whether the one constraint holds for `g`.
fn fits(g: &DeviceGroup, attribute: &str, op: &str, value: &str) -> bool {
    let req = request("gpu", vec![constraint(attribute, op, value)]);
    check_group(&req, g).is_ok()
}

fn errors(input: RequestInput) -> Vec<String> {
    DeviceRequest::build(&input)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn names_parse_in_three_forms_and_cdi() {
    let n = DeviceName::parse("gpu").unwrap();
    assert_eq!(
        (n.vendor, n.device_type.as_str(), n.name),
        (None, "gpu", None)
    );
    let n = DeviceName::parse("nvidia/gpu").unwrap();
    assert_eq!(n.vendor.as_deref(), Some("nvidia"));
    let n = DeviceName::parse("nvidia/gpu/Tesla K80/PCIe").unwrap();
    assert_eq!(n.name.as_deref(), Some("Tesla K80/PCIe"));
    assert_eq!(n.to_string(), "nvidia/gpu/Tesla K80/PCIe");
    for bad in ["", "/gpu", "nvidia/", "nvidia//x", "nvidia/gpu/", "a\nb"] {
        assert!(DeviceName::parse(bad).is_err(), "{bad:?}");
    }
    match DeviceTarget::parse("nvidia.com/gpu=0").unwrap() {
        DeviceTarget::Cdi(q) => assert_eq!(q.to_string(), "nvidia.com/gpu=0"),
        other => panic!("{other:?}"),
    }
    let e = DeviceTarget::parse("nvidia.com/=0").unwrap_err();
    assert!(
        e.contains("not a CDI device name") && e.contains("missing class"),
        "{e}"
    );
}

#[test]
fn names_match_as_nomads_tuples() {
    let id = k80("12 GiB").id();
    for (name, want) in [
        ("gpu", true),
        ("fpga", false),
        ("nvidia/gpu", true),
        ("amd/gpu", false),
        ("nvidia/gpu/Tesla K80", true),
        ("nvidia/gpu/Tesla T4", false),
        ("nvidia/gpu/tesla k80", false),
        ("Nvidia/gpu", false),
    ] {
        assert_eq!(
            DeviceName::parse(name).unwrap().matches(&id),
            want,
            "{name}"
        );
    }
    let req = request("nvidia/gpu/Tesla T4", vec![]);
    assert_eq!(
        check_group(&req, &k80("12 GiB")).unwrap_err(),
        ["device nvidia/gpu/Tesla K80 is not nvidia/gpu/Tesla T4"]
    );
}

#[test]
fn build_applies_defaults_and_keeps_what_was_written() {
    let r = DeviceRequest::build(&RequestInput {
        name: "nvidia/gpu".into(),
        count: None,
        constraints: vec![ConstraintInput {
            attribute: "${device.attr.memory}".into(),
            operator: None,
            value: "4 GiB".into(),
        }],
        affinities: vec![AffinityInput {
            attribute: "${device.model}".into(),
            operator: Some("==".into()),
            value: "Tesla K80".into(),
            weight: None,
        }],
    })
    .unwrap();
    assert_eq!(r.count, 1);
    assert_eq!(r.constraints[0].operator, Operand::Equal);
    assert_eq!(r.affinities[0].operator, Operand::Equal);
    assert_eq!(r.affinities[0].weight, 50);
    r.validate().unwrap();
    // The stored form: snake_case, stable.
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "name": "nvidia/gpu",
            "target": {"plugin": {"vendor": "nvidia", "device_type": "gpu"}},
            "count": 1,
            "constraints": [{"attribute": "${device.attr.memory}", "operator": "equal", "value": "4 GiB"}],
            "affinities": [{"attribute": "${device.model}", "operator": "equal", "value": "Tesla K80", "weight": 50}],
        })
    );
    assert_eq!(serde_json::from_value::<DeviceRequest>(json).unwrap(), r);
    let cdi = request("nvidia.com/gpu=0", vec![]);
    let json = serde_json::to_value(&cdi).unwrap();
    assert_eq!(
        json["target"],
        serde_json::json!({"cdi": "nvidia.com/gpu=0"})
    );
    assert_eq!(serde_json::from_value::<DeviceRequest>(json).unwrap(), cdi);
    // Older records without constraints or affinities load.
    let old: DeviceRequest = serde_json::from_str(
        r#"{"name": "gpu", "target": {"plugin": {"device_type": "gpu"}}, "count": 2}"#,
    )
    .unwrap();
    assert_eq!(old.count, 2);
    old.validate().unwrap();
    let mut forged = old.clone();
    forged.name = "fpga".into();
    assert!(
        forged.validate().unwrap_err()[0]
            .to_string()
            .starts_with("name: ")
    );
    // Every spelling.
    for (s, op) in [
        ("=", Operand::Equal),
        ("==", Operand::Equal),
        ("is", Operand::Equal),
        ("!=", Operand::NotEqual),
        ("not", Operand::NotEqual),
        ("<", Operand::Less),
        ("<=", Operand::LessOrEqual),
        (">", Operand::Greater),
        (">=", Operand::GreaterOrEqual),
        ("regexp", Operand::Regexp),
        ("version", Operand::Version),
        ("semver", Operand::Semver),
        ("set_contains", Operand::SetContains),
        ("set_contains_all", Operand::SetContainsAll),
        ("set_contains_any", Operand::SetContainsAny),
        ("is_set", Operand::IsSet),
        ("is_not_set", Operand::IsNotSet),
    ] {
        assert_eq!(Operand::parse(s), Some(op), "{s}");
        assert_eq!(Operand::parse(op.as_str()), Some(op));
    }
    assert_eq!(Operand::parse("≈"), None);
}

#[test]
fn build_reports_every_problem_with_its_field() {
    let e = errors(RequestInput {
        name: "nvidia/gpu".into(),
        count: Some(0),
        constraints: vec![
            constraint("${device.attr.memory}", "≈", "4 GiB"),
            constraint("${device.model}", "regexp", "Tesla("),
            constraint("${device.attr.driver}", "version", ">= 1.x"),
            constraint("${device.attr.driver}", "semver", "~> 1.2"),
            constraint("${node.class}", "=", "x"),
            constraint("${device.model}", "=", "${device.colour}"),
            constraint("${device.attr.x}", "is_set", "yes"),
            constraint("${device.attr.x}", ">=", ""),
            constraint("", "=", "x"),
            constraint("${device.attr.x}", "distinct_hosts", "true"),
            constraint("a ${device.model}", "=", "x"),
            constraint("${device.attr.}", "=", "x"),
            constraint("${device.ids}", "set_contains", ""),
        ],
        affinities: vec![
            affinity("${device.model}", "=", "K80", 0),
            affinity("${device.model}", "=", "K80", 101),
            affinity("${device.model}", "=", "K80", -300),
            affinity("${device.attr.x}", "is_set", "", 10),
        ],
    });
    let want = [
        "count: must be at least 1",
        "constraint[0].operator: unknown operator \"≈\"",
        "constraint[1].value: regexp does not compile: unclosed group",
        "constraint[2].value: not a version constraint: \"1.x\" is not a version",
        "constraint[3].value: not a semver constraint: \"~> 1.2\" is not a version",
        "constraint[4].attribute: \"${node.class}\": device constraints can only use ${device.model|vendor|type|ids|attr.<name>}",
        "constraint[5].value: \"${device.colour}\": device constraints can only use ${device.model|vendor|type|ids|attr.<name>}",
        "constraint[6].value: is_set takes no value",
        "constraint[7].value: is required by operator >=",
        "constraint[8].attribute: is required",
        "constraint[9].operator: unknown operator \"distinct_hosts\" (distinct_hosts and distinct_property place allocs",
        "constraint[10].attribute: \"a ${device.model}\": device constraints can only use ${device.model|vendor|type|ids|attr.<name>}, each as the whole attribute or value",
        "constraint[11].attribute: \"${device.attr.}\": device constraints can only use",
        "constraint[12].value: is required by operator set_contains",
        "affinity[0].weight: must not be 0",
        "affinity[1].weight: 101 is outside -100 to 100",
        "affinity[2].weight: -300 is outside -100 to 100",
        "affinity[3].operator: is_set applies to constraints only",
    ];
    assert_eq!(e.len(), want.len(), "{e:#?}");
    for (got, want) in e.iter().zip(want) {
        assert!(got.starts_with(want), "{got}\n  wanted {want}");
    }
    // A reference as a regexp or version value is checked when it has a value.
    request(
        "gpu",
        vec![
            constraint("${device.attr.a}", "regexp", "${device.attr.b}"),
            constraint("${device.attr.a}", "version", "${device.attr.b}"),
        ],
    );
    // Weights at the ends of the range.
    for w in [-100, -1, 1, 100] {
        DeviceRequest::build(&RequestInput {
            name: "gpu".into(),
            affinities: vec![affinity("${device.model}", "=", "x", w)],
            ..Default::default()
        })
        .unwrap();
    }
}

#[test]
fn cdi_requests_are_one_named_device() {
    let e = errors(RequestInput {
        name: "nvidia.com/gpu=0".into(),
        count: Some(2),
        constraints: vec![constraint("${device.model}", "=", "x")],
        affinities: vec![affinity("${device.model}", "=", "x", 10)],
    });
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("count: is 2, but a CDI device request names one device: count must be 1")
    );
    assert!(
        e[1].starts_with("constraint[0]: a CDI device is named exactly and takes no constraint")
    );
    assert!(e[2].starts_with("affinity[0]: a CDI device is named exactly and takes no affinity"));
    let r = DeviceRequest::build(&RequestInput {
        name: "nvidia.com/gpu=0".into(),
        count: Some(1),
        ..Default::default()
    })
    .unwrap();
    assert!(matches!(r.target, DeviceTarget::Cdi(_)));
    let e = check_group(&r, &k80("1 GiB")).unwrap_err();
    assert!(e[0].contains("resolved from CDI specs"), "{e:?}");
    let e = errors(RequestInput {
        name: "nvidia.com/gpu=".into(),
        ..Default::default()
    });
    assert!(e[0].starts_with("name: not a CDI device name"), "{e:?}");
    assert!(errors(RequestInput::default())[0].starts_with("name: is empty"));
}

#[test]
fn units_convert_in_constraints() {
    for (memory, want) in [
        ("4096 MiB", true),
        ("8 GiB", true),
        ("4 GiB", true),
        ("2048 MiB", false),
        ("4294967296000 mW", false),
        ("4 GB", false),
        ("5 GB", true),
        ("0.5 TiB", true),
    ] {
        assert_eq!(
            fits(&k80(memory), "${device.attr.memory}", ">=", "4 GiB"),
            want,
            "{memory}"
        );
    }
    let g = k80("12 GiB");
    assert!(fits(&g, "${device.attr.clock}", ">", "1400 MHz"));
    assert!(fits(&g, "${device.attr.clock}", "=", "1500 MHz"));
    assert!(fits(&g, "${device.attr.power}", "<", "0.5 kW"));
    assert!(fits(&g, "${device.attr.power}", "=", "300000 mW"));
    // Reversed sides.
    assert!(fits(&g, "4 GiB", "<=", "${device.attr.memory}"));
    // Another base never compares.
    assert!(!fits(&g, "${device.attr.memory}", ">=", "4 GHz"));
    assert!(!fits(&g, "${device.attr.memory}", "!=", "4 GHz"));
    assert!(!fits(&g, "${device.attr.memory}", ">=", "4"));
}

#[test]
fn failures_say_why() {
    let req = request(
        "nvidia/gpu",
        vec![
            constraint("${device.attr.memory}", ">=", "4 GiB"),
            constraint("${device.attr.bar1}", ">=", "1 GiB"),
            constraint("${device.attr.memory}", ">=", "4 GHz"),
            constraint("${device.attr.memory}", "is_not_set", ""),
            constraint("${device.ids}", "set_contains", "GPU-7"),
            constraint("${device.attr.memory}", "version", ">= 1.0"),
            constraint("4", "<", "3"),
            constraint("${device.attr.ecc}", ">", "false"),
            constraint("${device.attr.memory}", ">=", "${device.attr.bar1}"),
            constraint("${device.model}", "regexp", "${device.attr.features}"),
        ],
    );
    let why = check_group(&req, &k80("2 GiB")).unwrap_err();
    let want = [
        "constraint ${device.attr.memory} >= 4 GiB failed: memory is 2 GiB",
        "constraint ${device.attr.bar1} >= 1 GiB failed: attribute bar1 is not set",
        "constraint ${device.attr.memory} >= 4 GHz failed: memory is 2 GiB; 2 GiB does not compare with 4 GHz",
        "constraint ${device.attr.memory} is_not_set failed: attribute memory is set (2 GiB)",
        "constraint ${device.ids} set_contains GPU-7 failed: ids are GPU-0,GPU-1",
        "constraint ${device.attr.memory} version >= 1.0 failed: memory is 2 GiB; \"2 GiB\" is not a version",
        "constraint 4 < 3 failed: 4 < 3 does not hold",
        "constraint ${device.attr.ecc} > false failed: ecc is true; bools are only equal or not",
        "constraint ${device.attr.memory} >= ${device.attr.bar1} failed: memory is 2 GiB; attribute bar1 is not set",
        "constraint ${device.model} regexp ${device.attr.features} failed: model is Tesla K80; features is fp16, fp32,tensor",
    ];
    assert_eq!(why.len(), want.len(), "{why:#?}");
    for (got, want) in why.iter().zip(want) {
        assert!(got.starts_with(want), "{got}\n  wanted {want}");
    }
    assert_eq!(check_group(&req, &k80("2 GiB")).unwrap_err().len(), 10);
}

#[test]
fn every_operand() {
    let g = k80("12 GiB");
    let cases: &[(&str, &str, &str, bool)] = &[
        // Equality: strings, numbers, bools; missing sides.
        ("${device.model}", "=", "Tesla K80", true),
        ("${device.model}", "==", "Tesla T4", false),
        ("${device.vendor}", "is", "nvidia", true),
        ("${device.type}", "=", "gpu", true),
        ("${device.attr.ecc}", "=", "true", true),
        ("${device.attr.ecc}", "=", "false", false),
        ("${device.attr.cuda_cores}", "=", "4992", true),
        ("${device.attr.nope}", "=", "x", false),
        // Not equal: nil != some is true, nil != nil false.
        ("${device.model}", "!=", "Tesla T4", true),
        ("${device.model}", "not", "Tesla K80", false),
        ("${device.attr.nope}", "!=", "x", true),
        ("${device.attr.nope}", "!=", "${device.attr.none}", false),
        ("${device.attr.ecc}", "!=", "false", true),
        // Ordering: numeric for numbers, lexical for strings.
        ("${device.attr.cuda_cores}", ">", "1000", true),
        ("${device.attr.cuda_cores}", "<", "1000", false),
        ("${device.attr.cuda_cores}", "<=", "4992", true),
        ("${device.attr.cuda_cores}", ">=", "4992.5", false),
        ("${device.model}", "<", "Tesla T4", true),
        ("${device.model}", ">", "Tesla", true),
        ("${device.vendor}", "<", "amd", false),
        ("${device.attr.nope}", "<", "1", false),
        // A string that reads as a number compares as one with a number.
        ("${device.attr.compute}", ">=", "7", true),
        ("${device.attr.compute}", "<", "10", true),
        ("${device.attr.compute}", "=", "7.5", true),
        // Two strings stay lexical: "7.5" > "10".
        ("${device.attr.compute}", ">", "${device.attr.ten}", true),
        ("${device.attr.compute}", ">", "10", false),
        // Bools are not ordered.
        ("${device.attr.ecc}", ">=", "true", true),
        ("${device.attr.ecc}", "<", "false", false),
        // Regexp: unanchored unless anchored.
        ("${device.model}", "regexp", "K[0-9]+", true),
        ("${device.model}", "regexp", "^K", false),
        ("${device.model}", "regexp", "(?i)^tesla", true),
        ("${device.attr.memory}", "regexp", "GiB$", true),
        ("${device.attr.nope}", "regexp", ".*", false),
        // Version and semver.
        (
            "${device.attr.driver_version}",
            "version",
            ">= 470.0, < 500",
            true,
        ),
        (
            "${device.attr.driver_version}",
            "version",
            "~> 470.57",
            true,
        ),
        ("${device.attr.driver_version}", "version", "> 470.9", true),
        ("${device.attr.driver_version}", "version", "< 470", false),
        (
            "${device.attr.driver_version}",
            "semver",
            ">= 470.57.2",
            true,
        ),
        ("${device.attr.driver_version}", "semver", "1.2", false),
        ("${device.attr.cuda_cores}", "version", ">= 4000", true),
        ("${device.attr.compute}", "version", "1.2", false),
        ("${device.attr.compute}", "version", "7.5", true),
        ("${device.model}", "version", ">= 1", false),
        ("${device.attr.nope}", "version", ">= 1", false),
        // Sets, comma-separated and trimmed.
        ("${device.attr.features}", "set_contains", "fp32", true),
        (
            "${device.attr.features}",
            "set_contains",
            "fp32, tensor",
            true,
        ),
        (
            "${device.attr.features}",
            "set_contains_all",
            "fp32,int8",
            false,
        ),
        (
            "${device.attr.features}",
            "set_contains_any",
            "int8, fp16",
            true,
        ),
        (
            "${device.attr.features}",
            "set_contains_any",
            "int8,bf16",
            false,
        ),
        ("${device.ids}", "set_contains", "GPU-1", true),
        ("${device.ids}", "set_contains_any", "GPU-9,GPU-0", true),
        ("${device.attr.nope}", "set_contains_any", "x", false),
        // Set or not.
        ("${device.attr.memory}", "is_set", "", true),
        ("${device.attr.nope}", "is_set", "", false),
        ("${device.attr.nope}", "is_not_set", "", true),
        ("${device.attr.memory}", "is_not_set", "", false),
    ];
    for (attribute, op, value, want) in cases {
        let mut g = g.clone();
        g.attributes.insert("ten".into(), Attribute::string("10"));
        assert_eq!(
            fits(&g, attribute, op, value),
            *want,
            "{attribute} {op} {value}"
        );
    }
}

#[test]
fn affinities_score_as_nomad() {
    let score = |affinities: Vec<AffinityInput>, g: &DeviceGroup| {
        let req = DeviceRequest::build(&RequestInput {
            name: "nvidia/gpu".into(),
            affinities,
            ..Default::default()
        })
        .unwrap();
        (affinity_score(&req, g), affinity_weights(&req, g))
    };
    let g = k80("12 GiB");
    assert_eq!(score(vec![], &g).0, 0.0);
    let (s, w) = score(
        vec![
            affinity("${device.model}", "=", "Tesla K80", 50),
            affinity("${device.attr.memory}", ">=", "16 GiB", 25),
            affinity("${device.attr.ecc}", "=", "true", -25),
        ],
        &g,
    );
    assert_eq!((w.matched, w.total), (25.0, 100.0));
    assert_eq!(s, 0.25);
    assert_eq!(
        score(vec![affinity("${device.model}", "=", "Tesla K80", -40)], &g).0,
        -1.0
    );
    assert_eq!(
        score(
            vec![affinity("${device.model}", "regexp", "Tesla", 100)],
            &g
        )
        .0,
        1.0
    );
    assert_eq!(AffinityWeights::default().score(), 0.0);
}

#[test]
fn instances_can_be_picked_by_id() {
    let g = k80("12 GiB");
    let req = request(
        "gpu",
        vec![
            constraint("${device.ids}", "set_contains_any", "GPU-1,GPU-3"),
            constraint("${device.attr.memory}", ">=", "1 GiB"),
        ],
    );
    check_group(&req, &g).unwrap();
    assert!(!instance_fits(&req, &g, "GPU-0"));
    assert!(instance_fits(&req, &g, "GPU-1"));
    // Without ids constraints every instance may be chosen.
    let req = request(
        "gpu",
        vec![constraint("${device.attr.memory}", ">=", "1 GiB")],
    );
    assert!(instance_fits(&req, &g, "GPU-0"));
}
