//! The commit plan's rules, example by example, then as properties of arbitrary batches: ids
//! dense and ordered, one revision chain per record, idempotent replays, repeated ids in one push.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use serde_json::value::RawValue;

use super::*;
use crate::domain::sync::{RecordTexts, Refused};
use crate::testing::config;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).single().unwrap_or_default()
}

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_string()).unwrap()
}

fn record(id: &str) -> IncomingRecord {
    let data = format!(r#"{{"id":"{id}"}}"#);
    let texts = RecordTexts {
        id,
        form_type: "household",
        form_version: "1",
        data: Some(&data),
        ..Default::default()
    };
    IncomingRecord::new(texts).unwrap()
}

fn push(tid: Option<&str>, ids: &[&str]) -> Push {
    Push {
        client_id: "phone".into(),
        transmission_id: tid.map(str::to_string),
        fingerprint: ids.join(",").into_bytes(),
        records: ids.iter().map(|id| record(id)).collect(),
        warnings: Vec::new(),
        pushed_by: "alice".into(),
        expected_generation: None,
    }
}

fn stored(entries: &[(&str, i64, &str)]) -> HashMap<String, CurrentState> {
    entries
        .iter()
        .map(|(id, change_id, owner)| {
            let state = CurrentState {
                change_id: *change_id,
                created_at: Some(now() - chrono::Duration::days(1)),
                created_by: owner.to_string(),
                data: Some(raw(r#"{"stored":true}"#)),
            };
            (id.to_string(), state)
        })
        .collect()
}

/// Decides and plans `pushes` against `states`, at head 10 in generation 1.
fn run<'a>(pushes: &[&'a Push], states: &'a HashMap<String, CurrentState>) -> (Vec<Decision>, Plan<'a>) {
    let decisions = decide(pushes, Vec::new(), 1);
    let plan = plan(pushes, &decisions, states, 10, 1, now(), &OutOfScope::new());
    (decisions, plan)
}

#[test]
fn a_revision_is_kept_in_32_bytes() {
    assert_eq!(std::mem::size_of::<Revision>(), 32);
    assert_eq!(std::mem::size_of::<PlannedRevision>(), 104);
}

#[test]
fn an_empty_batch_keeps_the_head() {
    let states = HashMap::new();
    let (_, plan) = run(&[], &states);
    assert_eq!(plan.head, 10);
    assert!(plan.revision_count() == 0 && plan.superseded_in_batch.is_empty());
}

#[test]
fn new_records_get_the_next_ids_and_their_pusher_as_owner() {
    let p = push(Some("t1"), &["a", "b"]);
    let states = HashMap::new();
    let (decisions, plan) = run(&[&p], &states);
    assert_eq!(decisions, [Decision::Apply]);
    let ids: Vec<i64> = plan.revisions().map(|r| r.change_id).collect();
    assert_eq!(ids, [11, 12]);
    assert!(plan.revisions().all(|r| r.created_by == "alice" && r.overwrote.is_none()));
    assert!(plan.revisions().all(|r| r.created_at == Some(now()) && r.updated_at == Some(now())));
    let result = plan.results[0].as_ref().unwrap();
    assert_eq!(result.head, 12);
    assert_eq!(result.items, [("a".to_string(), 11), ("b".to_string(), 12)]);
    assert_eq!(plan.transmissions(&[&p]).count(), 1);
}

#[test]
fn an_update_overwrites_the_stored_state_and_keeps_owner_and_creation_time() {
    let mut p = push(None, &["a"]);
    p.pushed_by = "bob".into();
    let states = stored(&[("a", 7, "alice")]);
    let (_, plan) = run(&[&p], &states);
    let r = &plan.revision(0);
    assert_eq!((r.change_id, r.overwrote, r.created_by), (11, Some(7), "alice"));
    assert_eq!(r.created_at, states["a"].created_at);
    assert_eq!(plan.transmissions(&[&p]).count(), 0, "no transmission id, nothing to replay");
}

#[test]
fn a_deletion_without_data_keeps_the_stored_data_or_gets_an_empty_object() {
    let mut p = push(None, &["a", "new"]);
    for r in &mut p.records {
        *r = r.with_texts(|t| t.data = None).unwrap();
        r.deleted = true;
    }
    let states = stored(&[("a", 3, "alice")]);
    let (_, plan) = run(&[&p], &states);
    assert_eq!(plan.revision(0).data, r#"{"stored":true}"#);
    assert_eq!(plan.revision(1).data, "{}");
}

#[test]
fn repeated_ids_in_one_push_form_a_chain_and_only_the_last_is_current() {
    let mut p = push(Some("t1"), &["a", "b", "a", "a"]);
    p.records[0].created_at = Some(now() - chrono::Duration::hours(2));
    let states = HashMap::new();
    let (_, plan) = run(&[&p], &states);
    let a: Vec<(i64, Option<i64>)> =
        plan.revisions().filter(|r| r.record.id() == "a").map(|r| (r.change_id, r.overwrote)).collect();
    assert_eq!(a, [(11, None), (13, Some(11)), (14, Some(13))]);
    assert_eq!(plan.superseded_in_batch, [0, 2]);
    // The first revision's creation time sticks to the record.
    assert!(plan
        .revisions()
        .filter(|r| r.record.id() == "a")
        .all(|r| r.created_at == p.records[0].created_at));
    assert_eq!(plan.results[0].as_ref().unwrap().items.len(), 4);
}

#[test]
fn a_stale_base_version_is_a_conflict_warning_in_record_order() {
    let mut p = push(None, &["a", "b"]);
    p.records[0].base_version = Some(5);
    p.records[1].base_version = Some(9);
    p.warnings = vec![(1, Warning::missing_form_type("b", "form_type"))];
    let states = stored(&[("a", 9, "alice"), ("b", 9, "alice")]);
    let (_, plan) = run(&[&p], &states);
    assert!(plan.revision(0).conflict && !plan.revision(1).conflict);
    let codes: Vec<&str> =
        plan.results[0].as_ref().unwrap().warnings.iter().map(|w| w.code.as_str()).collect();
    assert_eq!(codes, ["CONFLICT_OVERWRITTEN", "MISSING_FORM_TYPE"]);
}

#[test]
fn stored_and_same_batch_transmissions_replay_and_other_payloads_mismatch() {
    let first = push(Some("t1"), &["a"]);
    let again = push(Some("t1"), &["a"]);
    let other = push(Some("t1"), &["b"]);
    let old = push(Some("t0"), &["c"]);
    let old_changed = push(Some("t0"), &["d"]);
    let stored_result = PushResult {
        head: 3,
        repository_generation: 1,
        items: vec![("c".into(), 3)],
        warnings: vec![],
        refused: vec![],
    };
    let stored = vec![StoredTransmission {
        client_id: "phone".into(),
        transmission_id: "t0".into(),
        fingerprint: old.fingerprint.clone(),
        result: Ok(stored_result.clone()),
    }];
    let pushes = [&first, &again, &other, &old, &old_changed];
    let decisions = decide(&pushes, stored, 1);
    assert_eq!(
        decisions,
        [
            Decision::Apply,
            Decision::SameAs(0),
            Decision::Mismatch,
            Decision::Replay(stored_result.clone()),
            Decision::Mismatch
        ]
    );
    let states = HashMap::new();
    let plan = plan(&pushes, &decisions, &states, 10, 1, now(), &OutOfScope::new());
    assert_eq!(plan.head, 11, "only the first push stores anything");
    let applied = plan.results[0].clone().unwrap();
    assert_eq!(
        plan.outcomes(decisions),
        [
            Outcome::Applied(applied.clone()),
            Outcome::Replayed(applied),
            Outcome::Mismatch,
            Outcome::Replayed(stored_result),
            Outcome::Mismatch
        ]
    );
}

#[test]
fn a_stored_result_that_cannot_be_read_fails_its_retry_and_plans_nothing_for_it() {
    let retry = push(Some("t0"), &["c"]);
    let changed = push(Some("t0"), &["d"]);
    let new = push(Some("t1"), &["e"]);
    let unreadable = Unreadable("missing field `items`".into());
    let stored = vec![StoredTransmission {
        client_id: "phone".into(),
        transmission_id: "t0".into(),
        fingerprint: retry.fingerprint.clone(),
        result: Err(unreadable.clone()),
    }];
    let pushes = [&retry, &changed, &new];
    let decisions = decide(&pushes, stored, 1);
    assert_eq!(decisions, [Decision::Unreadable(unreadable.clone()), Decision::Mismatch, Decision::Apply]);
    let states = HashMap::new();
    let plan = plan(&pushes, &decisions, &states, 10, 1, now(), &OutOfScope::new());
    assert_eq!(plan.head, 11, "the rest of the batch lands");
    assert_eq!(plan.transmissions(&pushes).count(), 1, "the unreadable result is not stored again");
    assert_eq!(plan.outcomes(decisions)[..2], [Outcome::Unreadable(unreadable), Outcome::Mismatch]);
}

#[test]
fn another_generation_stores_nothing() {
    let mut p = push(Some("t1"), &["a"]);
    p.expected_generation = Some(1);
    let mut q = push(Some("t2"), &["b"]);
    q.expected_generation = Some(2);
    let decisions = decide(&[&p, &q], Vec::new(), 2);
    assert_eq!(decisions, [Decision::ResetRequired, Decision::Apply]);
    let states = HashMap::new();
    let plan = plan(&[&p, &q], &decisions, &states, 10, 2, now(), &OutOfScope::new());
    assert_eq!(plan.results[1].as_ref().unwrap().repository_generation, 2);
    assert_eq!(plan.outcomes(decisions)[0], Outcome::ResetRequired(2));
}

#[test]
fn records_to_read_are_those_of_applied_pushes() {
    let mut p = push(None, &["b", "a", "b"]);
    p.records[2] = p.records[2].with_texts(|t| t.data = None).unwrap();
    let skipped = push(Some("t"), &["z"]);
    let decisions = vec![Decision::Apply, Decision::Mismatch];
    let (ids, need_data) = records_to_read(&[&p, &skipped], &decisions);
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(need_data, ["b"]);
}

// ---- properties ----

/// A batch as the change log might see it: few clients, transmission ids and record ids, so that
/// retries, duplicates and repeated records are common.
#[derive(Debug, Clone)]
struct Batch {
    pushes: Vec<Push>,
    states: HashMap<String, CurrentState>,
    transmissions: Vec<StoredTransmission>,
    head: i64,
}

fn arb_record() -> impl Strategy<Value = IncomingRecord> {
    (
        prop::sample::select(vec!["a", "b", "c", "d", "e"]),
        any::<bool>(),
        proptest::option::of(0i64..12),
        proptest::option::of(0i64..3),
    )
        .prop_map(|(id, with_data, base_version, created)| {
            let mut r = record(id).with_texts(|t| t.data = with_data.then_some(r#"{"x":1}"#)).unwrap();
            r.deleted = !with_data;
            r.base_version = base_version;
            r.created_at = created.map(|h| now() - chrono::Duration::hours(h));
            r
        })
}

fn arb_push() -> impl Strategy<Value = Push> {
    (
        prop::sample::select(vec!["c1", "c2"]),
        proptest::option::of(prop::sample::select(vec!["t1", "t2", "t3"])),
        0u8..2,
        proptest::collection::vec(arb_record(), 0..5),
        prop::sample::select(vec!["u1", "u2"]),
        prop_oneof![4 => Just(None), 1 => Just(Some(1i64)), 1 => Just(Some(2i64))],
    )
        .prop_map(|(client, tid, print, records, by, expected_generation)| Push {
            client_id: client.into(),
            transmission_id: tid.map(str::to_string),
            fingerprint: vec![print],
            records,
            warnings: Vec::new(),
            pushed_by: by.into(),
            expected_generation,
        })
}

fn arb_batch() -> impl Strategy<Value = Batch> {
    (
        proptest::collection::vec(arb_push(), 0..8),
        proptest::collection::btree_map(prop::sample::select(vec!["a", "b", "c"]), 1i64..=10, 0..3),
        proptest::collection::vec(
            (
                prop::sample::select(vec!["c1", "c2"]),
                prop::sample::select(vec!["t1", "t2"]),
                0u8..2,
                prop::bool::weighted(0.2),
            ),
            0..3,
        ),
    )
        .prop_map(|(pushes, stored_ids, transmissions)| {
            let states = stored_ids
                .into_iter()
                .map(|(id, change_id)| {
                    let state = CurrentState {
                        change_id,
                        created_at: Some(now() - chrono::Duration::days(change_id)),
                        created_by: format!("owner-{id}"),
                        data: Some(raw(r#"{"stored":true}"#)),
                    };
                    (id.to_string(), state)
                })
                .collect();
            let mut seen = HashSet::new();
            let transmissions = transmissions
                .into_iter()
                .filter(|(c, t, _, _)| seen.insert((*c, *t)))
                .map(|(c, t, print, unreadable)| StoredTransmission {
                    client_id: c.into(),
                    transmission_id: t.into(),
                    fingerprint: vec![print],
                    result: if unreadable {
                        Err(Unreadable("invalid type".into()))
                    } else {
                        Ok(PushResult {
                            head: 1,
                            repository_generation: 1,
                            items: vec![],
                            warnings: vec![],
                            refused: vec![],
                        })
                    },
                })
                .collect();
            Batch { pushes, states, transmissions, head: 10 }
        })
}

/// The decision the rules call for, worked out independently of `decide`.
fn expected_decision(b: &Batch, i: usize) -> Decision {
    let p = &b.pushes[i];
    if p.expected_generation.is_some_and(|g| g != 1) {
        return Decision::ResetRequired;
    }
    let Some(tid) = &p.transmission_id else { return Decision::Apply };
    let same_key = |q: &Push| q.client_id == p.client_id && q.transmission_id.as_ref() == Some(tid);
    if let Some(s) = b.transmissions.iter().find(|s| s.client_id == p.client_id && &s.transmission_id == tid)
    {
        return if s.fingerprint == p.fingerprint {
            s.result.clone().map_or_else(Decision::Unreadable, Decision::Replay)
        } else {
            Decision::Mismatch
        };
    }
    let first =
        b.pushes[..i].iter().position(|q| same_key(q) && q.expected_generation.is_none_or(|g| g == 1));
    match first {
        None => Decision::Apply,
        Some(j) if b.pushes[j].fingerprint == p.fingerprint => Decision::SameAs(j),
        Some(_) => Decision::Mismatch,
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn decisions_follow_the_replay_rules(b in arb_batch()) {
        let pushes: Vec<&Push> = b.pushes.iter().collect();
        let decisions = decide(&pushes, b.transmissions.clone(), 1);
        for (i, d) in decisions.iter().enumerate() {
            prop_assert_eq!(d, &expected_decision(&b, i), "push {}", i);
        }
    }

    #[test]
    fn ids_are_dense_and_in_push_then_record_order(b in arb_batch()) {
        let pushes: Vec<&Push> = b.pushes.iter().collect();
        let decisions = decide(&pushes, b.transmissions.clone(), 1);
        let plan = plan(&pushes, &decisions, &b.states, b.head, 1, now(), &OutOfScope::new());
        let expected: Vec<(*const IncomingRecord, i64)> = pushes
            .iter()
            .zip(&decisions)
            .filter(|(_, d)| matches!(d, Decision::Apply))
            .flat_map(|(p, _)| p.records.iter())
            .zip(b.head + 1..)
            .map(|(r, id)| (r as *const IncomingRecord, id))
            .collect();
        let planned: Vec<(*const IncomingRecord, i64)> =
            plan.revisions().map(|r| (r.record as *const IncomingRecord, r.change_id)).collect();
        prop_assert_eq!(planned, expected.clone());
        prop_assert_eq!(plan.head, b.head + expected.len() as i64);
        for (i, result) in plan.results.iter().enumerate() {
            prop_assert_eq!(result.is_some(), matches!(decisions[i], Decision::Apply));
            if let Some(result) = result {
                prop_assert_eq!(result.head, plan.head);
                let ids: Vec<&str> = result.items.iter().map(|(id, _)| id.as_str()).collect();
                let sent: Vec<&str> = pushes[i].records.iter().map(IncomingRecord::id).collect();
                prop_assert_eq!(ids, sent);
            }
        }
    }

    #[test]
    fn each_record_has_one_unbroken_revision_chain(b in arb_batch()) {
        let pushes: Vec<&Push> = b.pushes.iter().collect();
        let decisions = decide(&pushes, b.transmissions.clone(), 1);
        let plan = plan(&pushes, &decisions, &b.states, b.head, 1, now(), &OutOfScope::new());
        let mut chains: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, r) in plan.revisions().enumerate() {
            chains.entry(r.record.id()).or_default().push(i);
        }
        let mut superseded: Vec<usize> = plan.superseded_in_batch.clone();
        superseded.sort_unstable();
        let mut expected_superseded = Vec::new();
        for (id, rows) in &chains {
            let stored = b.states.get(*id);
            let mut previous = stored.map(|s| s.change_id);
            let owner = stored.map_or(rows.first().map_or("", |&i| plan.revision(i).push.pushed_by.as_str()), |s| s.created_by.as_str());
            for &i in rows {
                let r = &plan.revision(i);
                prop_assert_eq!(r.overwrote, previous, "record {}", id);
                prop_assert_eq!(r.created_by, owner);
                prop_assert_eq!(r.conflict, matches!((r.record.base_version, previous), (Some(base), Some(p)) if base < p));
                previous = Some(r.change_id);
            }
            expected_superseded.extend_from_slice(&rows[..rows.len() - 1]);
        }
        expected_superseded.sort_unstable();
        prop_assert_eq!(superseded, expected_superseded, "every revision but each record's last is superseded, once");
    }

    #[test]
    fn replaying_a_committed_batch_changes_nothing(b in arb_batch()) {
        let pushes: Vec<&Push> = b.pushes.iter().collect();
        let decisions = decide(&pushes, b.transmissions.clone(), 1);
        let first = plan(&pushes, &decisions, &b.states, b.head, 1, now(), &OutOfScope::new());
        let mut stored = b.transmissions.clone();
        stored.extend(first.transmissions(&pushes).map(|(p, tid, result)| StoredTransmission {
            client_id: p.client_id.clone(),
            transmission_id: tid.to_string(),
            fingerprint: p.fingerprint.clone(),
            result: Ok(result.clone()),
        }));
        let first_head = first.head;
        let answers = first.outcomes(decisions);

        // The same pushes again, as retries after the commit: each named one gets its answer again.
        let again = decide(&pushes, stored, 1);
        let states = HashMap::new();
        let second = plan(&pushes, &again, &states, first_head, 1, now(), &OutOfScope::new());
        let second_head = second.head;
        for (i, (answer, retry)) in answers.iter().zip(second.outcomes(again)).enumerate() {
            if pushes[i].transmission_id.is_none() || matches!(answer, Outcome::ResetRequired(_)) {
                continue;
            }
            match (answer, &retry) {
                (Outcome::Applied(r) | Outcome::Replayed(r), Outcome::Replayed(again)) => prop_assert_eq!(r, again),
                (Outcome::Mismatch, Outcome::Mismatch) => {}
                (Outcome::Unreadable(first), Outcome::Unreadable(again)) => prop_assert_eq!(first, again),
                _ => prop_assert!(false, "push {}: {:?} then {:?}", i, answer, retry),
            }
        }
        let unnamed: usize = pushes
            .iter()
            .filter(|p| p.transmission_id.is_none() && p.expected_generation.is_none_or(|g| g == 1))
            .map(|p| p.records.len())
            .sum();
        prop_assert_eq!(second_head, first_head + unnamed as i64, "only pushes without a transmission id apply again");
    }
}

#[test]
fn a_stored_record_out_of_the_pushers_scope_is_refused_alone() {
    let mut bob = push(Some("t2"), &["x", "theirs"]);
    bob.pushed_by = "bob".into();
    let alice = push(Some("t1"), &["new", "theirs", "mine"]);
    let pushes = [&alice, &bob];
    let decisions = decide(&pushes, Vec::new(), 1);
    let states = stored(&[("theirs", 3, "carol"), ("mine", 4, "alice")]);
    let out_of_scope: OutOfScope = [("alice".to_string(), "theirs".to_string())].into_iter().collect();
    let plan = plan(&pushes, &decisions, &states, 10, 1, now(), &out_of_scope);
    // Ids stay dense: the refusal takes one for the tombstone addressed to alice.
    assert_eq!(plan.head, 15);
    assert_eq!(plan.refusals.len(), 1);
    assert_eq!(
        (plan.refusals[0].pushed_by, plan.refusals[0].record_id, plan.refusals[0].change_id),
        ("alice", "theirs", 12)
    );
    let ids: Vec<(&str, i64)> = plan.revisions().map(|r| (r.record.id(), r.change_id)).collect();
    assert_eq!(ids, [("new", 11), ("mine", 13), ("x", 14), ("theirs", 15)], "bob may change it");
    let result = plan.results[0].as_ref().unwrap();
    assert_eq!(result.items, [("new".to_string(), 11), ("mine".to_string(), 13)]);
    assert_eq!(result.refused, [Refused::out_of_scope(1, "theirs")]);
    assert_eq!(result.head, 15);
    assert!(plan.results[1].as_ref().unwrap().refused.is_empty());
}
