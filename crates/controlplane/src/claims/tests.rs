use super::*;

use AccessMode::{
    MultiNodeMultiWriter, MultiNodeReaderOnly, MultiNodeSingleWriter, SingleNodeMultiWriter,
    SingleNodeReaderOnly, SingleNodeSingleWriter, SingleNodeWriter,
};
use AttachmentMode::{BlockDevice, FileSystem};
use ClaimMode::{Read, Write};

fn claim_as(
    alloc: &str,
    node: &str,
    mode: ClaimMode,
    access_mode: AccessMode,
    attachment_mode: AttachmentMode,
) -> Claim {
    Claim {
        alloc_id: alloc.into(),
        node_id: node.into(),
        mode,
        access_mode,
        attachment_mode,
    }
}

fn c(alloc: &str, node: &str, mode: ClaimMode, access_mode: AccessMode) -> Claim {
    claim_as(alloc, node, mode, access_mode, FileSystem)
}

fn fs(mode: AccessMode) -> Vec<(AccessMode, AttachmentMode)> {
    vec![(mode, FileSystem)]
}

/// Claims `new` and checks what every call must guarantee: `check` agrees with `claim`, a
/// refusal changes nothing, a grant stores exactly `new`.
fn try_claim(
    set: &mut ClaimSet,
    caps: &[(AccessMode, AttachmentMode)],
    new: Claim,
) -> Result<ClaimOutcome, ClaimError> {
    let before = set.clone();
    let checked = set.check(caps, &new);
    let got = set.claim(caps, new.clone());
    match &got {
        Ok(_) => {
            assert_eq!(checked, Ok(()), "check disagrees with claim for {new:?}");
            assert_eq!(set.get(&new.alloc_id), Some(&new));
        }
        Err(e) => {
            assert_eq!(
                checked.as_ref(),
                Err(e),
                "check disagrees with claim for {new:?}"
            );
            assert_eq!(*set, before, "refused claim {new:?} changed the set");
        }
    }
    got
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Ok,
    /// `ReadOnly`
    Ro,
    /// `OtherNode`
    Node,
    /// `SingleWorkload`
    One,
    /// `WriterExists`
    Wr,
}

fn kind(r: &Result<ClaimOutcome, ClaimError>) -> Want {
    match r {
        Ok(_) => Want::Ok,
        Err(ClaimError::ReadOnly { .. }) => Want::Ro,
        Err(ClaimError::OtherNode { .. }) => Want::Node,
        Err(ClaimError::SingleWorkload { .. }) => Want::One,
        Err(ClaimError::WriterExists { .. }) => Want::Wr,
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

/// Claims already on the volume, all from node `n1`: reader `r0`, writer `w0`.
const EXISTING: [(&str, &[(&str, ClaimMode)]); 4] = [
    ("none", &[]),
    ("reader", &[("r0", Read)]),
    ("writer", &[("w0", Write)]),
    ("reader+writer", &[("r0", Read), ("w0", Write)]),
];

/// The new claim, by alloc `x`: (mode, node). `n1` is the node of the existing claims.
const REQUESTS: [(ClaimMode, &str); 4] = [(Read, "n1"), (Write, "n1"), (Read, "n2"), (Write, "n2")];

type Row = Option<[Want; 4]>;

/// Expected result per mode: one row per [`EXISTING`] (`None`: that state cannot be reached in
/// this mode), one column per [`REQUESTS`].
fn table() -> Vec<(AccessMode, [Row; 4])> {
    use Want::*;
    vec![
        (
            SingleNodeWriter,
            [
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Ok, Node, Node]),
                Some([Ok, Wr, Node, Node]),
                Some([Ok, Wr, Node, Node]),
            ],
        ),
        (
            SingleNodeReaderOnly,
            [Some([Ok, Ro, Ok, Ro]), Some([Ok, Ro, Node, Ro]), None, None],
        ),
        (
            MultiNodeReaderOnly,
            [Some([Ok, Ro, Ok, Ro]), Some([Ok, Ro, Ok, Ro]), None, None],
        ),
        (
            MultiNodeSingleWriter,
            [
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Wr, Ok, Wr]),
                Some([Ok, Wr, Ok, Wr]),
            ],
        ),
        (
            MultiNodeMultiWriter,
            [
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Ok, Ok, Ok]),
            ],
        ),
        (
            SingleNodeSingleWriter,
            [
                Some([Ok, Ok, Ok, Ok]),
                Some([One, One, Node, Node]),
                Some([One, One, Node, Node]),
                None,
            ],
        ),
        (
            SingleNodeMultiWriter,
            [
                Some([Ok, Ok, Ok, Ok]),
                Some([Ok, Ok, Node, Node]),
                Some([Ok, Ok, Node, Node]),
                Some([Ok, Ok, Node, Node]),
            ],
        ),
    ]
}

#[test]
fn every_mode_request_and_existing_state() {
    let table = table();
    assert_eq!(
        table.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
        AccessMode::ALL,
        "the table covers every mode"
    );
    let mut cases = 0;
    for (mode, rows) in table {
        let caps = fs(mode);
        for ((state, existing), row) in EXISTING.iter().zip(rows) {
            let mut set = ClaimSet::new();
            let setup: Result<Vec<_>, _> = existing
                .iter()
                .map(|(alloc, m)| set.claim(&caps, c(alloc, "n1", *m, mode)))
                .collect();
            let Some(row) = row else {
                assert!(
                    setup.is_err(),
                    "{mode}: state {state} should be unreachable"
                );
                continue;
            };
            setup.unwrap_or_else(|e| panic!("{mode}: setting up {state}: {e}"));
            for ((claim_mode, node), want) in REQUESTS.iter().zip(row) {
                cases += 1;
                let what = format!("{mode}, existing {state}, {claim_mode} from {node}");
                let mut set = set.clone();
                let got = try_claim(&mut set, &caps, c("x", node, *claim_mode, mode));
                assert_eq!(kind(&got), want, "{what}: got {got:?}");
                match got {
                    Ok(outcome) => {
                        assert_eq!(outcome, ClaimOutcome::Granted, "{what}");
                        assert_eq!(set.len(), existing.len() + 1, "{what}");
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains(mode.as_str()), "{what}: {msg}");
                        // The conflicting alloc is named: the writer for a writer conflict,
                        // else the first claim in alloc-id order.
                        let culprit = match want {
                            Want::Wr => Some("w0"),
                            Want::Node | Want::One => Some(existing[0].0),
                            _ => None,
                        };
                        if let Some(culprit) = culprit {
                            assert!(msg.contains(&format!("{culprit:?}")), "{what}: {msg}");
                        }
                        if want == Want::Node {
                            assert!(msg.contains("\"n1\"") && msg.contains("\"n2\""), "{msg}");
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 23 * 4);
}

#[test]
fn error_messages_name_mode_and_conflict() {
    let mut set = ClaimSet::new();
    let caps = fs(SingleNodeWriter);
    set.claim(&caps, c("a1", "n1", Write, SingleNodeWriter))
        .unwrap();
    let e = set
        .check(&caps, &c("a2", "n1", Write, SingleNodeWriter))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"volume is single-node-writer and alloc "a1" already writes to it from node "n1""#
    );
    let e = set
        .check(&caps, &c("a2", "n2", Read, SingleNodeWriter))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"volume is single-node-writer and alloc "a1" already uses it on node "n1", not "n2""#
    );

    let caps = fs(SingleNodeSingleWriter);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("a1", "n1", Read, SingleNodeSingleWriter))
        .unwrap();
    let e = set
        .check(&caps, &c("a2", "n1", Read, SingleNodeSingleWriter))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"volume is single-node-single-writer (one workload at a time) and alloc "a1" already claims it"#
    );

    let e = ClaimSet::new()
        .check(
            &fs(MultiNodeReaderOnly),
            &c("a", "n", Write, MultiNodeReaderOnly),
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "volume is multi-node-reader-only and refuses writers"
    );
}

#[test]
fn same_claim_again_is_unchanged() {
    for mode in AccessMode::ALL {
        let caps = fs(mode);
        let claim_mode = if mode.is_read_only() { Read } else { Write };
        let mut set = ClaimSet::new();
        let first = c("a", "n1", claim_mode, mode);
        assert_eq!(
            try_claim(&mut set, &caps, first.clone()),
            Ok(ClaimOutcome::Granted)
        );
        let before = set.clone();
        assert_eq!(
            try_claim(&mut set, &caps, first.clone()),
            Ok(ClaimOutcome::Unchanged)
        );
        assert_eq!(set, before, "{mode}");
        // Still idempotent after the volume's capabilities changed: the claim was checked
        // when it was granted.
        assert_eq!(
            set.claim(&[], first.clone()),
            Ok(ClaimOutcome::Unchanged),
            "{mode}"
        );
        assert_eq!(set.check(&[], &first), Ok(()), "{mode}");
        assert_eq!(set, before, "{mode}");
    }
}

#[test]
fn read_to_write_is_checked_like_a_new_writer() {
    for mode in [SingleNodeWriter, MultiNodeSingleWriter] {
        let caps = fs(mode);
        let mut set = ClaimSet::new();
        set.claim(&caps, c("r", "n1", Read, mode)).unwrap();
        set.claim(&caps, c("w", "n1", Write, mode)).unwrap();
        let err = try_claim(&mut set, &caps, c("r", "n1", Write, mode)).unwrap_err();
        assert!(
            matches!(&err, ClaimError::WriterExists { alloc_id, .. } if alloc_id == "w"),
            "{mode}: {err:?}"
        );
        assert_eq!(
            set.get("r").unwrap().mode,
            Read,
            "{mode}: the read claim is kept"
        );

        assert!(set.release("w").is_some());
        assert_eq!(
            try_claim(&mut set, &caps, c("r", "n1", Write, mode)),
            Ok(ClaimOutcome::Changed {
                previous: c("r", "n1", Read, mode)
            })
        );
        assert_eq!(set.writers().count(), 1);
        assert_eq!(set.readers().count(), 0);
    }

    // A reader-only mode refuses the upgrade.
    let caps = fs(SingleNodeReaderOnly);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("r", "n1", Read, SingleNodeReaderOnly))
        .unwrap();
    assert!(matches!(
        try_claim(&mut set, &caps, c("r", "n1", Write, SingleNodeReaderOnly)),
        Err(ClaimError::ReadOnly { .. })
    ));

    // The one workload of single-node-single-writer may change its own claim.
    let caps = fs(SingleNodeSingleWriter);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("r", "n1", Read, SingleNodeSingleWriter))
        .unwrap();
    assert!(matches!(
        try_claim(&mut set, &caps, c("r", "n1", Write, SingleNodeSingleWriter)),
        Ok(ClaimOutcome::Changed { .. })
    ));
}

#[test]
fn write_to_read_replaces_the_claim() {
    let caps = fs(SingleNodeWriter);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("a", "n1", Write, SingleNodeWriter))
        .unwrap();
    set.claim(&caps, c("b", "n1", Read, SingleNodeWriter))
        .unwrap();
    assert_eq!(
        try_claim(&mut set, &caps, c("a", "n1", Read, SingleNodeWriter)),
        Ok(ClaimOutcome::Changed {
            previous: c("a", "n1", Write, SingleNodeWriter)
        })
    );
    assert_eq!(set.writers().count(), 0);
    // The writer slot is free again.
    assert_eq!(
        try_claim(&mut set, &caps, c("b", "n1", Write, SingleNodeWriter)),
        Ok(ClaimOutcome::Changed {
            previous: c("b", "n1", Read, SingleNodeWriter)
        })
    );
}

#[test]
fn release_then_reclaim() {
    for mode in [
        SingleNodeWriter,
        SingleNodeSingleWriter,
        SingleNodeMultiWriter,
    ] {
        let caps = fs(mode);
        let mut set = ClaimSet::new();
        let a = c("a", "n1", Write, mode);
        set.claim(&caps, a.clone()).unwrap();
        assert!(matches!(
            try_claim(&mut set, &caps, c("b", "n2", Write, mode)),
            Err(ClaimError::OtherNode { .. })
        ));
        assert_eq!(set.release("a"), Some(a.clone()), "{mode}");
        assert!(set.is_empty());
        assert_eq!(set.release("a"), None, "{mode}: released twice");
        assert_eq!(
            try_claim(&mut set, &caps, c("b", "n2", Write, mode)),
            Ok(ClaimOutcome::Granted)
        );
        // And the first alloc can come back once the second is gone.
        set.release("b").unwrap();
        assert_eq!(try_claim(&mut set, &caps, a), Ok(ClaimOutcome::Granted));
    }

    let caps = fs(MultiNodeSingleWriter);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("w1", "n1", Write, MultiNodeSingleWriter))
        .unwrap();
    set.claim(&caps, c("r", "n2", Read, MultiNodeSingleWriter))
        .unwrap();
    let w2 = c("w2", "n3", Write, MultiNodeSingleWriter);
    assert!(try_claim(&mut set, &caps, w2.clone()).is_err());
    set.release("w1").unwrap();
    assert_eq!(try_claim(&mut set, &caps, w2), Ok(ClaimOutcome::Granted));
}

#[test]
fn release_of_unknown_alloc_changes_nothing() {
    let caps = fs(MultiNodeMultiWriter);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("a", "n1", Write, MultiNodeMultiWriter))
        .unwrap();
    let before = set.clone();
    assert_eq!(set.release("b"), None);
    assert_eq!(set, before);
}

#[test]
fn capability_must_be_offered() {
    let caps = vec![
        (SingleNodeWriter, FileSystem),
        (MultiNodeReaderOnly, BlockDevice),
    ];
    let mut set = ClaimSet::new();
    for (access, attach) in [
        (SingleNodeWriter, BlockDevice),
        (MultiNodeReaderOnly, FileSystem),
        (MultiNodeMultiWriter, FileSystem),
    ] {
        let err =
            try_claim(&mut set, &caps, claim_as("a", "n1", Read, access, attach)).unwrap_err();
        assert_eq!(
            err,
            ClaimError::UnsupportedCapability {
                access_mode: access,
                attachment_mode: attach,
                offered: caps.clone(),
            }
        );
        assert_eq!(
            err.to_string(),
            format!(
                "volume has no capability {access}/{attach} (it offers \
                 single-node-writer/file-system, multi-node-reader-only/block-device)"
            )
        );
    }
    let err = try_claim(&mut set, &[], c("a", "n1", Read, SingleNodeWriter)).unwrap_err();
    assert!(err.to_string().ends_with("(it offers none)"), "{err}");
    assert!(set.is_empty());

    // The capability is checked before the mode rules: even a free volume refuses it.
    let mut set = ClaimSet::new();
    set.claim(&caps, c("w", "n1", Write, SingleNodeWriter))
        .unwrap();
    assert!(matches!(
        try_claim(&mut set, &caps, c("w2", "n1", Write, MultiNodeMultiWriter)),
        Err(ClaimError::UnsupportedCapability { .. })
    ));
}

#[test]
fn one_mode_in_use_at_a_time() {
    let caps = vec![
        (SingleNodeWriter, FileSystem),
        (SingleNodeWriter, BlockDevice),
        (MultiNodeReaderOnly, FileSystem),
    ];
    let mut set = ClaimSet::new();
    set.claim(&caps, c("a", "n1", Write, SingleNodeWriter))
        .unwrap();
    assert_eq!(set.mode_in_use(), Some((SingleNodeWriter, FileSystem)));

    let err = try_claim(
        &mut set,
        &caps,
        claim_as("b", "n1", Read, SingleNodeWriter, BlockDevice),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"volume is in use as single-node-writer/file-system by alloc "a", so it cannot be claimed as single-node-writer/block-device"#
    );
    // A multi-node mode would let a reader onto another node while "a" holds the volume as a
    // single-node writer.
    let err = try_claim(&mut set, &caps, c("b", "n2", Read, MultiNodeReaderOnly)).unwrap_err();
    assert!(matches!(err, ClaimError::ModeInUse { ref alloc_id, .. } if alloc_id == "a"));

    // The only claimant may change its own mode.
    assert!(matches!(
        try_claim(&mut set, &caps, c("a", "n1", Read, MultiNodeReaderOnly)),
        Ok(ClaimOutcome::Changed { .. })
    ));
    assert_eq!(set.mode_in_use(), Some((MultiNodeReaderOnly, FileSystem)));
    assert_eq!(
        try_claim(&mut set, &caps, c("b", "n2", Read, MultiNodeReaderOnly)),
        Ok(ClaimOutcome::Granted)
    );

    // Once the volume is free, any offered mode may be picked.
    set.release("a").unwrap();
    set.release("b").unwrap();
    assert_eq!(set.mode_in_use(), None);
    assert_eq!(
        try_claim(
            &mut set,
            &caps,
            claim_as("b", "n1", Write, SingleNodeWriter, BlockDevice)
        ),
        Ok(ClaimOutcome::Granted)
    );
}

#[test]
fn an_alloc_stays_on_its_node() {
    let caps = fs(MultiNodeMultiWriter);
    let mut set = ClaimSet::new();
    set.claim(&caps, c("a", "n1", Read, MultiNodeMultiWriter))
        .unwrap();
    let err = try_claim(&mut set, &caps, c("a", "n2", Read, MultiNodeMultiWriter)).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"alloc "a" already claims the volume from node "n1", not "n2"; release it first"#
    );
    set.release("a").unwrap();
    assert_eq!(
        try_claim(&mut set, &caps, c("a", "n2", Read, MultiNodeMultiWriter)),
        Ok(ClaimOutcome::Granted)
    );
}

#[test]
fn validate_names_the_field() {
    let ok = c("a", "n", Write, MultiNodeMultiWriter);
    assert_eq!(ok.validate(), Ok(()));
    let cases = [
        ("a/b", "n", "alloc_id"),
        ("", "n", "alloc_id"),
        ("..", "n", "alloc_id"),
        ("a\0", "n", "alloc_id"),
        (&"x".repeat(129), "n", "alloc_id"),
        ("a", "", "node_id"),
        ("a", ".", "node_id"),
        ("a", "n/../etc", "node_id"),
        // Both bad: alloc_id is reported first.
        ("", "", "alloc_id"),
    ];
    let caps = fs(MultiNodeMultiWriter);
    for (alloc, node, field) in cases {
        let bad = c(alloc, node, Write, MultiNodeMultiWriter);
        let err = bad.validate().unwrap_err();
        assert_eq!(err.kind, field, "{alloc:?}/{node:?}");
        assert!(
            err.to_string().starts_with(&format!("invalid {field} ")),
            "{err}"
        );

        // Bad input is refused before anything else and changes nothing, even with no
        // capabilities offered.
        let mut set = ClaimSet::new();
        set.claim(&caps, c("other", "n", Write, MultiNodeMultiWriter))
            .unwrap();
        let got = try_claim(&mut set, &[], bad).unwrap_err();
        assert_eq!(got, ClaimError::Invalid(err));
    }
}

#[test]
fn queries() {
    let caps = fs(MultiNodeSingleWriter);
    let mut set = ClaimSet::new();
    assert!(set.is_empty());
    assert!(set.nodes().is_empty());
    for claim in [
        c("d", "n2", Read, MultiNodeSingleWriter),
        c("b", "n1", Write, MultiNodeSingleWriter),
        c("a", "n1", Read, MultiNodeSingleWriter),
        c("c", "n3", Read, MultiNodeSingleWriter),
    ] {
        set.claim(&caps, claim).unwrap();
    }
    let ids = |it: Vec<&Claim>| it.iter().map(|c| c.alloc_id.clone()).collect::<Vec<_>>();
    assert_eq!(set.len(), 4);
    assert_eq!(ids(set.iter().collect()), ["a", "b", "c", "d"]);
    assert_eq!(ids(set.writers().collect()), ["b"]);
    assert_eq!(ids(set.readers().collect()), ["a", "c", "d"]);
    assert_eq!(
        set.nodes().into_iter().collect::<Vec<_>>(),
        ["n1", "n2", "n3"]
    );
    assert_eq!(ids(set.on_node("n1").collect()), ["a", "b"]);
    assert_eq!(set.on_node("n9").count(), 0);
    let by_node = set.by_node();
    assert_eq!(
        by_node.keys().copied().collect::<Vec<_>>(),
        ["n1", "n2", "n3"]
    );
    assert_eq!(ids(by_node["n1"].clone()), ["a", "b"]);
    assert_eq!(ids(by_node["n3"].clone()), ["c"]);
    assert_eq!(set.get("b").unwrap().mode, Write);
    assert_eq!(set.get("z"), None);
    assert_eq!(set.mode_in_use(), Some((MultiNodeSingleWriter, FileSystem)));
}

#[test]
fn json_round_trip() {
    let caps = vec![(SingleNodeWriter, BlockDevice)];
    let mut set = ClaimSet::new();
    set.claim(
        &caps,
        claim_as("b", "n1", Read, SingleNodeWriter, BlockDevice),
    )
    .unwrap();
    set.claim(
        &caps,
        claim_as("a", "n1", Write, SingleNodeWriter, BlockDevice),
    )
    .unwrap();
    let json = serde_json::to_value(&set).unwrap();
    assert_eq!(
        json,
        serde_json::json!([
            {"alloc_id": "a", "node_id": "n1", "mode": "write",
             "access_mode": "single-node-writer", "attachment_mode": "block-device"},
            {"alloc_id": "b", "node_id": "n1", "mode": "read",
             "access_mode": "single-node-writer", "attachment_mode": "block-device"},
        ])
    );
    let back: ClaimSet = serde_json::from_value(json).unwrap();
    assert_eq!(back, set);
    assert_eq!(
        serde_json::from_str::<ClaimSet>("[]").unwrap(),
        ClaimSet::new()
    );
}

#[test]
fn json_with_duplicate_or_bad_ids_is_refused() {
    let one = r#"{"alloc_id":"a","node_id":"n1","mode":"read","access_mode":"multi-node-reader-only","attachment_mode":"file-system"}"#;
    let err = serde_json::from_str::<ClaimSet>(&format!("[{one},{one}]")).unwrap_err();
    assert!(
        err.to_string()
            .contains(r#"alloc "a" has more than one claim"#),
        "{err}"
    );

    let bad = one.replace(r#""n1""#, r#""../n1""#);
    let err = serde_json::from_str::<ClaimSet>(&format!("[{bad}]")).unwrap_err();
    assert!(err.to_string().contains("invalid node_id"), "{err}");

    let err = serde_json::from_str::<ClaimSet>(&format!("[{}]", one.replace("read", "peek")))
        .unwrap_err();
    assert!(err.to_string().contains("peek"), "{err}");
}

/// The rules restated as properties of a whole set of claims, independently of the
/// implementation: a set is allowed when all its claims share one mode and that mode's limits
/// on nodes, writers and claims hold.
fn allowed(claims: &[&Claim]) -> bool {
    let Some(first) = claims.first() else {
        return true;
    };
    let mode = first.access_mode;
    if claims
        .iter()
        .any(|c| (c.access_mode, c.attachment_mode) != (mode, first.attachment_mode))
    {
        return false;
    }
    let (max_nodes, max_claims, max_writers) = match mode {
        SingleNodeWriter => (1, usize::MAX, 1),
        SingleNodeReaderOnly => (1, usize::MAX, 0),
        MultiNodeReaderOnly => (usize::MAX, usize::MAX, 0),
        MultiNodeSingleWriter => (usize::MAX, usize::MAX, 1),
        MultiNodeMultiWriter => (usize::MAX, usize::MAX, usize::MAX),
        SingleNodeSingleWriter => (1, 1, 1),
        SingleNodeMultiWriter => (1, usize::MAX, usize::MAX),
    };
    let nodes: BTreeSet<&str> = claims.iter().map(|c| c.node_id.as_str()).collect();
    let writers = claims.iter().filter(|c| c.mode == Write).count();
    nodes.len() <= max_nodes && claims.len() <= max_claims && writers <= max_writers
}

enum Op {
    Claim(Claim),
    Release(&'static str),
}

/// Every sequence of `depth` operations from `ops`: each claim is granted exactly when the
/// resulting set is [`allowed`] (so nothing allowed is refused), the set stays allowed, and
/// refusals change nothing.
fn explore(
    set: &ClaimSet,
    caps: &[(AccessMode, AttachmentMode)],
    ops: &[Op],
    depth: usize,
) -> usize {
    if depth == 0 {
        return 0;
    }
    let mut steps = 0;
    for op in ops {
        let mut next = set.clone();
        match op {
            Op::Claim(new) => {
                let own = set.get(&new.alloc_id);
                let mut after: Vec<&Claim> =
                    set.iter().filter(|c| c.alloc_id != new.alloc_id).collect();
                after.push(new);
                let expected = if own == Some(new) {
                    Some(ClaimOutcome::Unchanged)
                } else if caps.contains(&(new.access_mode, new.attachment_mode))
                    && own.is_none_or(|o| o.node_id == new.node_id)
                    && allowed(&after)
                {
                    Some(match own {
                        None => ClaimOutcome::Granted,
                        Some(o) => ClaimOutcome::Changed {
                            previous: o.clone(),
                        },
                    })
                } else {
                    None
                };
                let got = try_claim(&mut next, caps, new.clone());
                assert_eq!(got.ok(), expected, "{new:?} on {set:?}");
            }
            Op::Release(alloc) => {
                assert_eq!(next.release(alloc).as_ref(), set.get(alloc));
                assert_eq!(next.get(alloc), None);
            }
        }
        assert!(allowed(&next.iter().collect::<Vec<_>>()), "{next:?}");
        steps += 1 + explore(&next, caps, ops, depth - 1);
    }
    steps
}

#[test]
fn every_short_sequence_obeys_the_rules() {
    let mut total = 0;
    for mode in AccessMode::ALL {
        let other = if mode == MultiNodeMultiWriter {
            SingleNodeWriter
        } else {
            MultiNodeMultiWriter
        };
        let caps = vec![(mode, FileSystem), (mode, BlockDevice), (other, FileSystem)];
        let mut ops = Vec::new();
        for alloc in ["a", "b", "c"] {
            for node in ["n1", "n2"] {
                for claim_mode in [Read, Write] {
                    ops.push(Op::Claim(c(alloc, node, claim_mode, mode)));
                }
            }
            ops.push(Op::Release(alloc));
        }
        ops.push(Op::Claim(claim_as("a", "n1", Write, mode, BlockDevice)));
        ops.push(Op::Claim(c("b", "n1", Read, other)));
        total += explore(&ClaimSet::new(), &caps, &ops, 4);
    }
    assert!(total > 500_000, "{total}");
}
