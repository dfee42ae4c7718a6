//! Scoped sync (docs/api.md §20): the scope set's API, and what devices of scoped users receive.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{connect, Api, TestApp};

/// A device's store: what it holds after applying every pulled record (live) or tombstone.
#[derive(Default, Debug)]
pub struct Device {
    pub client_id: String,
    pub cursor: i64,
    pub records: BTreeMap<String, Value>,
}

impl Device {
    pub fn new(client_id: &str) -> Self {
        Device { client_id: client_id.into(), ..Device::default() }
    }

    /// Syncs to completion and returns every record received (with P1-P4 checked per page).
    pub async fn sync(&mut self, api: &Api, token: &str, limit: i64) -> Vec<Value> {
        let (records, cursor) = api.pull_all(token, &self.client_id, self.cursor, limit).await;
        for record in &records {
            let id = record["observation_id"].as_str().expect("id").to_string();
            if record["deleted"] == json!(true) {
                self.records.remove(&id);
            } else {
                self.records.insert(id, record["data"].clone());
            }
        }
        self.cursor = cursor;
        records
    }

    pub fn ids(&self) -> Vec<&str> {
        self.records.keys().map(String::as_str).collect()
    }
}

pub fn record(id: &str, form_type: &str, data: Value) -> Value {
    json!({"observation_id": id, "form_type": form_type, "form_version": "1", "data": data,
           "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "deleted": false})
}

pub async fn push(api: &Api, token: &str, client: &str, records: Vec<Value>) -> Value {
    let body =
        json!({"transmission_id": uuid::Uuid::new_v4().to_string(), "client_id": client, "records": records});
    let (status, body) = api.push(token, body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Sets the rules and waits until they are in force (the preparation runs in the background).
pub async fn set_rules(api: &Api, admin: &str, rules: Value) -> i64 {
    let (status, body) =
        api.call(Method::PUT, "/admin/scopes", Some(admin), Some(json!({"rules": rules}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["state"], "preparing");
    let version = body["version"].as_i64().expect("version");
    wait_in_force(api, admin, version).await;
    version
}

/// Waits for the preparation of `version` to finish and the version to be in force.
pub async fn wait_in_force(api: &Api, admin: &str, version: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = api.call(Method::GET, "/admin/scopes/status", Some(admin), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["preparing_version"].is_null() {
            let (_, set) = api.call(Method::GET, "/admin/scopes", Some(admin), None).await;
            let expected = if set["rules"].is_null() { 0 } else { version };
            assert_eq!(set["version"].as_i64(), Some(expected), "{set}");
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "version {version} still preparing: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn create_user(api: &Api, admin: &str, name: &str, role: &str, attributes: Value) -> String {
    let token = api.user_token(admin, name, role).await;
    set_attributes(api, admin, name, attributes).await;
    token
}

pub async fn set_attributes(api: &Api, admin: &str, name: &str, attributes: Value) {
    let (status, body) = api
        .call(Method::PUT, &format!("/users/{name}"), Some(admin), Some(json!({"attributes": attributes})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["attributes"], attributes);
}

fn district_rules() -> Value {
    json!([
        {"name": "workers: their districts' households", "applies_to": {"roles": ["read-only", "read-write"]},
         "form_types": ["household"], "where": {"field": "district", "in_attribute": "district"}},
        {"name": "everyone: facilities", "applies_to": {"roles": ["read-only", "read-write"]},
         "form_types": ["facility"]}
    ])
}

/// `POST /attachments/manifest` (the shape Formulus sends) from `cursor` for `client`'s device.
async fn attachment_manifest(app: &TestApp, token: &str, client: &str, cursor: i64) -> Value {
    let (status, manifest) = app
        .call(
            Method::POST,
            "/attachments/manifest",
            Some(token),
            Some(json!({"client_id": client, "since_version": cursor})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{manifest}");
    manifest
}

#[actix_web::test]
async fn a_worker_receives_their_districts_drops_the_rest_and_gains_a_new_district() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "north-worker", "read-write", json!({"district": ["north"]})).await;
    push(
        &app,
        &admin,
        "admin-device",
        vec![
            record("h-north", "household", json!({"district": "north", "n": 1})),
            record("h-east", "household", json!({"district": "east"})),
            record("h-south", "household", json!({"district": "south"})),
            record("f-1", "facility", json!({"name": "clinic"})),
            record("v-1", "visit", json!({"district": "north"})),
        ],
    )
    .await;
    push(&app, &north, "phone", vec![record("own-1", "visit", json!({"district": "east"}))]).await;

    // Before any set, the worker's phone holds everything.
    let mut phone = Device::new("phone");
    phone.sync(&app, &north, 2).await;
    assert_eq!(phone.ids(), ["f-1", "h-east", "h-north", "h-south", "own-1", "v-1"]);

    set_rules(&app, &admin, district_rules()).await;

    // The next sync drops what left the set, with tombstones above the cursor (S2), and keeps
    // the protocol (pull_all checks P2-P4 on every page).
    let received = phone.sync(&app, &north, 2).await;
    assert_eq!(phone.ids(), ["f-1", "h-north", "own-1"]);
    let tombstone = received.iter().find(|r| r["observation_id"] == "h-east").expect("tombstone of h-east");
    assert_eq!(tombstone["deleted"], true);
    assert_eq!(tombstone["data"], json!({}));
    // A new device of the same user receives exactly the set (S1).
    let mut tablet = Device::new("tablet");
    let received = tablet.sync(&app, &north, 1).await;
    assert_eq!(tablet.ids(), ["f-1", "h-north", "own-1"]);
    // A device starting from 0 reads in proportion to what it receives: no tombstones of the
    // records it never held (S5).
    assert_eq!(received.len(), 3, "{received:?}");
    assert_eq!(tablet.records["h-north"], json!({"district": "north", "n": 1}));

    // Given the east district, the existing east household arrives although its change is below
    // both devices' cursors (S3), without a reset.
    set_attributes(&app, &admin, "north-worker", json!({"district": ["north", "east"]})).await;
    phone.sync(&app, &north, 3).await;
    tablet.sync(&app, &north, 50).await;
    assert_eq!(phone.ids(), ["f-1", "h-east", "h-north", "own-1"]);
    assert_eq!(tablet.ids(), phone.ids());

    // Nothing new: an empty page at the head.
    let before = phone.cursor;
    assert!(phone.sync(&app, &north, 10).await.is_empty());
    assert_eq!(phone.cursor, before);

    // Admins see everything, always.
    let mut admin_device = Device::new("admin-device");
    admin_device.sync(&app, &admin, 4).await;
    assert_eq!(admin_device.ids().len(), 6);
}

#[actix_web::test]
async fn the_scope_set_api_validates_previews_and_audits() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let worker = create_user(&app, &admin, "w", "read-only", json!({"district": ["north"]})).await;

    let (status, body) = app.call(Method::GET, "/admin/scopes", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"activated_at": null, "rules": null, "version": 0}));
    let (status, _) = app.call(Method::GET, "/admin/scopes", Some(&worker), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Every problem is listed, and nothing is stored.
    let bad = json!([
        {"name": "a", "applies_to": {"roles": ["chief"]}, "form_types": []},
        {"name": "a", "applies_to": {"users": ["w"]}, "form_types": "*", "where": {"field": "a..b", "in_attribute": "d"}}
    ]);
    let (status, body) =
        app.call(Method::PUT, "/admin/scopes", Some(&admin), Some(json!({"rules": bad}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["code"], "BAD_REQUEST");
    let paths: Vec<&str> =
        body["errors"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        ["/rules/0/applies_to/roles/0", "/rules/0/form_types", "/rules/1/where/field", "/rules/1/name"]
    );
    let (status, body) =
        app.call(Method::PUT, "/admin/scopes", Some(&admin), Some(json!({"rules": "x"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = app
        .call(Method::PUT, "/users/w", Some(&admin), Some(json!({"attributes": {"bad name": ["x"]}})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("'bad name'"), "{body}");

    push(
        &app,
        &admin,
        "a",
        vec![
            record("h1", "household", json!({"district": "north"})),
            record("h2", "household", json!({"district": "east"})),
            record("f1", "facility", json!({})),
        ],
    )
    .await;
    let version = set_rules(&app, &admin, district_rules()).await;
    let (_, body) = app.call(Method::GET, "/admin/scopes", Some(&admin), None).await;
    assert_eq!(body["version"], version);
    assert_eq!(body["rules"], district_rules());

    let (status, body) = app.call(Method::GET, "/admin/scopes/preview?user=w", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["active"]["counts"], json!({"facility": 1, "household": 1}));
    assert_eq!(body["active"]["total"], 2);
    assert_eq!(body["active"]["everything"], false);
    assert_eq!(body["active"]["rules"].as_array().unwrap().len(), 2);
    assert!(body["preparing"].is_null());
    let (_, body) = app.call(Method::GET, "/admin/scopes/preview?user=admin", Some(&admin), None).await;
    assert_eq!(body["active"]["everything"], true);
    assert_eq!(body["active"]["total"], 3);
    let (status, _) = app.call(Method::GET, "/admin/scopes/preview?user=nobody", Some(&admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Back to no set: the worker receives everything again, through the same protocol.
    let (status, body) = app.call(Method::DELETE, "/admin/scopes", Some(&admin), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    wait_in_force(&app, &admin, body["version"].as_i64().unwrap()).await;
    let (_, body) = app.call(Method::GET, "/admin/scopes", Some(&admin), None).await;
    assert_eq!(body["version"], 0);
    let mut phone = Device::new("p");
    phone.sync(&app, &worker, 2).await;
    assert_eq!(phone.ids(), ["f1", "h1", "h2"]);
    // A DELETE with nothing in force changes nothing.
    let (status, body) = app.call(Method::DELETE, "/admin/scopes", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], 0);

    let (_, audit) = app.call(Method::GET, "/admin/audit?limit=100", Some(&admin), None).await;
    let actions: Vec<&str> =
        audit["items"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions.iter().filter(|a| **a == "scope.change").count(), 2, "{actions:?}");
    assert_eq!(actions.iter().filter(|a| **a == "scope.activate").count(), 2, "{actions:?}");
    assert!(actions.contains(&"user.attributes_change"));
}

/// The ids of an NDJSON export's records.
fn ndjson_ids(text: &str) -> Vec<String> {
    let mut ids: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("NDJSON line")["observation_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    ids.sort();
    ids
}

#[actix_web::test]
async fn every_other_reader_holds_the_visible_set() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let worker = create_user(&app, &admin, "w", "read-write", json!({"district": ["north"]})).await;
    let photo = "3f2a9c1e-7d1b-4c55-9e0f-1a2b3c4d5e6f.jpg";
    let other_photo = "other photo.jpg";
    for (id, bytes) in [(photo, &b"north photo"[..]), (other_photo, &b"east photo"[..])] {
        let (status, body) =
            app.put_bytes(&admin, &format!("/attachments/{id}"), bytes, Some("image/jpeg")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    push(
        &app,
        &admin,
        "admin-device",
        vec![
            record(
                "h-north",
                "household",
                json!({"district": "north", "photo": {"type": "image", "filename": photo}}),
            ),
            record("h-east", "household", json!({"district": "east", "photo": {"filename": other_photo}})),
        ],
    )
    .await;
    let (status, _) = app.call(Method::GET, "/stats/observations", Some(&worker), None).await;
    assert_eq!(status, StatusCode::OK, "no set: statistics for everyone");
    // Before any set the worker's manifest lists both photos.
    let manifest = attachment_manifest(&app, &worker, "phone", 0).await;
    assert_eq!(manifest["operation_count"], json!({"delete": 0, "download": 2}), "{manifest}");
    let cursor = manifest["current_version"].as_i64().unwrap();

    set_rules(&app, &admin, district_rules()).await;

    // One record: outside the set it is absent, with its history.
    let (status, _) = app.call(Method::GET, "/observations/h-east", Some(&worker), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.call(Method::GET, "/observations/h-east/history", Some(&worker), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app.call(Method::GET, "/observations/h-north", Some(&worker), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = app.call(Method::GET, "/observations/h-north/history", Some(&worker), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.call(Method::GET, "/observations/h-east", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "admins see everything");

    // Exports hold the visible set only.
    let text =
        app.send(Method::GET, "/data/export?format=json", Some(&worker), None).await.text().await.unwrap();
    assert_eq!(ndjson_ids(&text), ["h-north"]);
    let text =
        app.send(Method::GET, "/data/export?format=json", Some(&admin), None).await.text().await.unwrap();
    assert_eq!(ndjson_ids(&text), ["h-east", "h-north"]);

    // Attachments: through a visible record, or not at all.
    let (status, _, bytes) = app.get_bytes(&worker, &format!("/attachments/{photo}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bytes, b"north photo");
    let (status, _, _) = app.get_bytes(&worker, "/attachments/other%20photo.jpg").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The manifest after the old cursor takes the east photo back; from 0 it lists the north one.
    let manifest = attachment_manifest(&app, &worker, "phone", cursor).await;
    let ops: Vec<(String, String)> = manifest["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (o["attachment_id"].as_str().unwrap().to_owned(), o["operation"].as_str().unwrap().to_owned())
        })
        .collect();
    assert!(ops.contains(&(other_photo.to_owned(), "delete".to_owned())), "{manifest}");
    assert!(!ops.iter().any(|(id, op)| id == other_photo && op == "download"), "{manifest}");
    let (_, manifest) =
        app.call(Method::GET, "/attachments/manifest?after_change_id=0", Some(&worker), None).await;
    let ids: Vec<&str> = manifest["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["attachment_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [photo]);

    // Aggregates are for admins while a set is in force.
    let (status, _) = app.call(Method::GET, "/stats/observations", Some(&worker), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, status_body) = app.call(Method::GET, "/status", Some(&worker), None).await;
    assert!(status_body["observation_count"].is_null(), "{status_body}");
    assert_eq!(status_body["status"], "OK");
    let (_, status_body) = app.call(Method::GET, "/status", Some(&admin), None).await;
    assert_eq!(status_body["observation_count"], 2);
}

#[actix_web::test]
async fn pushes_under_a_set_reach_exactly_their_users_and_updates_outside_it_are_refused_alone() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "north", "read-write", json!({"district": ["north"]})).await;
    let east = create_user(&app, &admin, "east", "read-write", json!({"district": ["east"]})).await;
    set_rules(&app, &admin, district_rules()).await;
    let (mut north_phone, mut east_phone) = (Device::new("np"), Device::new("ep"));
    north_phone.sync(&app, &north, 5).await;
    east_phone.sync(&app, &east, 5).await;

    push(
        &app,
        &admin,
        "admin",
        vec![
            record("h1", "household", json!({"district": "north"})),
            record("h2", "household", json!({"district": "east"})),
            record("f1", "facility", json!({})),
        ],
    )
    .await;
    north_phone.sync(&app, &north, 2).await;
    east_phone.sync(&app, &east, 2).await;
    assert_eq!(north_phone.ids(), ["f1", "h1"]);
    assert_eq!(east_phone.ids(), ["f1", "h2"]);

    // h1 moves to the east: it leaves the north phone (a tombstone) and reaches the east one.
    push(&app, &admin, "admin", vec![record("h1", "household", json!({"district": "east", "moved": true}))])
        .await;
    north_phone.sync(&app, &north, 2).await;
    east_phone.sync(&app, &east, 2).await;
    assert_eq!(north_phone.ids(), ["f1"]);
    assert_eq!(east_phone.ids(), ["f1", "h1", "h2"]);
    assert_eq!(east_phone.records["h1"], json!({"district": "east", "moved": true}));

    // The north worker may create, and change their own and what they see; an update of a record
    // outside their set is refused alone, with a tombstone for their device.
    let body = json!({"transmission_id": "t-north-1", "client_id": "np", "records": [
        record("own", "visit", json!({"district": "west"})),
        record("h2", "household", json!({"district": "north", "stolen": true})),
        record("f1", "facility", json!({"name": "renamed"})),
    ]});
    let (status, answer) = app.push(&north, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["success_count"], 2, "{answer}");
    assert_eq!(
        answer["failed_records"],
        json!([{"index": 1, "id": "h2", "error": "OUT_OF_SCOPE",
        "message": "this record is outside the records you may change; it was not stored"}])
    );
    // A retry replays the same answer (the refusal included) and stores nothing.
    let (status, replay) = app.push(&north, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replay["failed_records"], answer["failed_records"]);
    let (_, h2) = app.call(Method::GET, "/observations/h2", Some(&admin), None).await;
    assert_eq!(h2["data"], json!({"district": "east"}), "the refused record is untouched");
    let (_, history) = app.call(Method::GET, "/observations/h2/history", Some(&admin), None).await;
    assert_eq!(history["revisions"].as_array().unwrap().len(), 1, "{history}");
    north_phone.sync(&app, &north, 2).await;
    assert_eq!(north_phone.ids(), ["f1", "own"]);
    assert_eq!(north_phone.records["f1"], json!({"name": "renamed"}));
    east_phone.sync(&app, &east, 2).await;
    assert_eq!(east_phone.ids(), ["f1", "h1", "h2"]);
    assert_eq!(east_phone.records["f1"], json!({"name": "renamed"}));

    // The spec dialect lists the refusal in `failures`.
    let (status, spec) = app
        .push(
            &north,
            json!({"transmission_id": "t-north-2", "client_id": "np", "records": [
            {"id": "h2", "schema_type": "household", "schema_version": "1", "data": {"district": "north"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{spec}");
    assert_eq!(spec["failures"][0]["code"], "OUT_OF_SCOPE", "{spec}");
    assert_eq!(spec["successes"], json!([]));
    let (_, history) = app.call(Method::GET, "/observations/h2/history", Some(&admin), None).await;
    assert_eq!(history["revisions"].as_array().unwrap().len(), 1, "{history}");
    let (_, stats) = app.call(Method::GET, "/stats/observations", Some(&admin), None).await;
    assert_eq!(stats["totalCount"], 4, "kept counts unchanged by refusals: {stats}");
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/upstream/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(path).expect("fixture")).expect("fixture JSON")
}

#[actix_web::test]
async fn real_clients_pull_scoped_data_unmodified() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let worker = create_user(&app, &admin, "midwest", "read-only", json!({"state": ["IL", "WI"]})).await;
    set_rules(
        &app,
        &admin,
        json!([{"name": "regional: people of their states", "applies_to": {"roles": ["read-only"]},
                "form_types": ["person_registration"], "where": {"field": "address.state", "in_attribute": "state"}}]),
    )
    .await;
    // The records as the synk command-line client pushes them.
    let (status, body) = app.push(&admin, fixture("test_observations.json")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Formulus 2026: x-ode-version, the generation header, `since.version` only, pages of 2.
    let generation = body["repository_generation"].as_i64().unwrap();
    let formulus = |req: reqwest::RequestBuilder| {
        req.bearer_auth(&worker)
            .header("x-ode-version", "1.4.2")
            .header("x-ode-client-id", "formulus-1")
            .header("x-repository-generation", generation.to_string())
    };
    let mut cursor = 0;
    let mut held = BTreeMap::new();
    loop {
        let res = formulus(app.client.post(app.url("/api/sync/pull?limit=2")))
            .json(&json!({"client_id": "formulus-1", "since": {"version": cursor}}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body: Value = res.json().await.unwrap();
        for r in body["records"].as_array().unwrap() {
            held.insert(r["observation_id"].as_str().unwrap().to_owned(), r["deleted"] == json!(true));
        }
        if body["has_more"] == json!(true) {
            cursor = body["change_cutoff"].as_i64().unwrap();
        } else {
            cursor = body["current_version"].as_i64().unwrap();
            break;
        }
    }
    assert_eq!(held, BTreeMap::from([("obs_001".to_owned(), false), ("obs_002".to_owned(), false)]));

    // The spec dialect (GET, as the interface specification's clients) and camel (desktop).
    let (status, spec) =
        app.call(Method::GET, "/sync/pull?client_id=desk&since=0&limit=50", Some(&worker), None).await;
    assert_eq!(status, StatusCode::OK, "{spec}");
    let ids: Vec<&str> =
        spec["records"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["obs_001", "obs_002"]);
    let (status, camel) = app
        .call(
            Method::POST,
            "/sync/pull",
            Some(&worker),
            Some(json!({"clientId": "web", "currentVersion": 0})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{camel}");
    assert_eq!(camel["changes"]["observations"].as_array().unwrap().len(), 2, "{camel}");

    // synk's deletion of all ten: the device receives tombstones of its two, nothing else.
    let (status, body) = app.push(&admin, fixture("test_delete_observations.json")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let res = formulus(app.client.post(app.url("/api/sync/pull?limit=50")))
        .json(&json!({"client_id": "formulus-1", "since": {"version": cursor}}))
        .send()
        .await
        .unwrap();
    let body: Value = res.json().await.unwrap();
    let pulled: Vec<(&str, bool)> = body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["observation_id"].as_str().unwrap(), r["deleted"] == json!(true)))
        .collect();
    assert_eq!(pulled, [("obs_001", true), ("obs_002", true)]);
}

#[actix_web::test]
async fn a_typed_scoped_pull_skips_nothing_when_its_sources_interleave() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let worker = create_user(&app, &admin, "w", "read-write", json!({"district": ["north"]})).await;
    set_rules(
        &app,
        &admin,
        json!([{"name": "north", "applies_to": {"roles": ["read-write"]}, "form_types": "*",
                "where": {"field": "district", "in_attribute": "district"}}]),
    )
    .await;
    // The worker's own visits first (their own source), then households and visits of the north
    // interleaved (one bucket), so every source's first rows are of the other type.
    let own: Vec<Value> =
        (0..6).map(|i| record(&format!("own-{i}"), "visit", json!({"district": "west"}))).collect();
    push(&app, &worker, "w-phone", own).await;
    let mixed: Vec<Value> = (0..12)
        .map(|i| {
            let form_type = if i % 4 == 3 { "household" } else { "visit" };
            record(&format!("n-{i:02}"), form_type, json!({"district": "north"}))
        })
        .collect();
    push(&app, &admin, "a", mixed).await;
    push(&app, &worker, "w-phone", vec![record("own-h", "household", json!({"district": "west"}))]).await;
    let mut after = 0;
    let mut got = Vec::new();
    loop {
        let body = json!({"client_id": "typed", "since": {"version": after}, "schema_types": ["household"]});
        let (status, page) = app.call(Method::POST, "/sync/pull?limit=1", Some(&worker), Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for r in page["records"].as_array().unwrap() {
            assert_eq!(r["form_type"], "household");
            got.push(r["observation_id"].as_str().unwrap().to_owned());
        }
        if page["has_more"] == json!(false) {
            break;
        }
        after = page["change_cutoff"].as_i64().unwrap();
    }
    got.sort();
    assert_eq!(got, ["n-03", "n-07", "n-11", "own-h"]);
}

/// A rule without `where` over every form type gives its users everything, as an admin sees it
/// (its bucket has no rows: docs/architecture.md, "Scoped sync"): they pull, read and update
/// every record; dropping the rule redelivers what they no longer see as tombstones, and
/// giving it back redelivers everything below their devices' cursors.
#[actix_web::test]
async fn a_rule_over_every_form_type_without_where_gives_everything() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let sup = create_user(&app, &admin, "sup", "read-write", json!({"district": ["north"]})).await;
    let worker = create_user(&app, &admin, "w", "read-write", json!({"district": ["south"]})).await;
    let supervisors = json!({"name": "supervisors", "applies_to": {"users": ["sup"]}, "form_types": "*"});
    let mut rules = district_rules().as_array().unwrap().clone();
    rules.push(supervisors);
    set_rules(&app, &admin, Value::Array(rules)).await;
    push(
        &app,
        &admin,
        "a",
        vec![
            record("h-north", "household", json!({"district": "north"})),
            record("h-south", "household", json!({"district": "south"})),
            record("v-1", "visit", json!({})),
        ],
    )
    .await;
    let mut phone = Device::new("sup-phone");
    phone.sync(&app, &sup, 2).await;
    assert_eq!(phone.ids(), ["h-north", "h-south", "v-1"]);
    let (status, _) = app.call(Method::GET, "/observations/v-1", Some(&sup), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, preview) = app.call(Method::GET, "/admin/scopes/preview?user=sup", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    assert_eq!(preview["active"]["everything"], true, "{preview}");
    // Updating a record of another district is the supervisor's right; the worker's is refused.
    let body = push(
        &app,
        &sup,
        "sup-phone",
        vec![record("h-south", "household", json!({"district": "south", "seen": 1}))],
    )
    .await;
    assert!(body["warnings"].as_array().is_none_or(|w| w.is_empty()), "{body}");
    let body =
        push(&app, &worker, "w-phone", vec![record("h-north", "household", json!({"district": "north"}))])
            .await;
    assert!(body.to_string().contains("OUT_OF_SCOPE"), "{body}");
    // The worker's device never held the supervisor's view.
    let mut worker_phone = Device::new("w-phone");
    worker_phone.sync(&app, &worker, 2).await;
    assert_eq!(worker_phone.ids(), ["h-south"]);

    // Without the rule the supervisor keeps their district's household only (changing a record
    // does not make it theirs: its author stays who created it).
    set_rules(&app, &admin, district_rules()).await;
    phone.sync(&app, &sup, 2).await;
    assert_eq!(phone.ids(), ["h-north"]);
    let mut fresh = Device::new("sup-tablet");
    fresh.sync(&app, &sup, 1).await;
    assert_eq!(fresh.ids(), phone.ids());

    // Given back, it brings back what is below the cursor.
    let mut rules = district_rules().as_array().unwrap().clone();
    rules.push(json!({"name": "supervisors", "applies_to": {"users": ["sup"]}, "form_types": "*"}));
    set_rules(&app, &admin, Value::Array(rules)).await;
    phone.sync(&app, &sup, 2).await;
    assert_eq!(phone.ids(), ["h-north", "h-south", "v-1"]);
}

/// The scoped page is planned generically (src/db/lent.rs); the connection it ran on goes back
/// to the pool with the setting reset, whether the page was read to its end or dropped early.
#[actix_web::test]
async fn the_scoped_page_leaves_its_connection_as_it_found_it() {
    use futures_util::StreamExt;

    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    create_user(&app, &admin, "w", "read-write", json!({"district": ["north"]})).await;
    let records: Vec<Value> =
        (0..5).map(|i| record(&format!("h-{i}"), "household", json!({"district": "north"}))).collect();
    push(&app, &admin, "a", records).await;
    set_rules(&app, &admin, district_rules()).await;
    for read_whole_page in [true, false] {
        let db = app.state.pool.get().await.unwrap();
        let pid: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
        let mut rows = synkronus::db::scope::pull::page(db, ("w", "phone"), 0, &[], 3).await.unwrap();
        let first = rows.next().await.expect("a row").unwrap();
        assert_eq!(first.get::<_, Option<&str>>(2), Some("h-0"));
        if read_whole_page {
            assert_eq!(rows.count().await, 3);
        } else {
            drop(rows);
        }
        // Take connections until the page's comes back (the reset runs as it is returned).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut held = Vec::new();
        loop {
            let db = app.state.pool.get().await.unwrap();
            if db.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get::<_, i32>(0) == pid {
                let mode: String = db.query_one("SHOW plan_cache_mode", &[]).await.unwrap().get(0);
                assert_eq!(mode, "auto");
                break;
            }
            held.push(db);
            assert!(tokio::time::Instant::now() < deadline, "the page's connection never came back");
            if held.len() >= app.state.pool.status().max_size {
                held.clear();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A user whose pages were scoped starts their next page on the scoped statement
/// (`records::ScopedReaders`); when they stop being scoped between two pulls, that page is still
/// the right one (the whole change log, with a type filter too) and the hint is dropped.
#[actix_web::test]
async fn a_user_no_longer_scoped_gets_every_record_on_the_scoped_statement() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let worker = create_user(&app, &admin, "w", "read-write", json!({"district": ["north"]})).await;
    push(
        &app,
        &admin,
        "a",
        vec![
            record("h-north", "household", json!({"district": "north"})),
            record("h-south", "household", json!({"district": "south"})),
            record("v-1", "visit", json!({"district": "south"})),
            record("v-2", "visit", json!({"district": "north"})),
            record("f-1", "facility", json!({})),
        ],
    )
    .await;
    set_rules(&app, &admin, district_rules()).await;
    let mut phone = Device::new("phone");
    phone.sync(&app, &worker, 2).await;
    assert_eq!(phone.ids(), ["f-1", "h-north"]);
    assert!(app.state.scoped_readers.knows("w"));

    let (status, body) = app.call(Method::DELETE, "/admin/scopes", Some(&admin), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    wait_in_force(&app, &admin, body["version"].as_i64().unwrap()).await;
    let pull = json!({"client_id": "tablet", "since": {"version": 0}, "schema_types": ["visit"]});
    let (status, page) = app.call(Method::POST, "/sync/pull?limit=5", Some(&worker), Some(pull)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let ids: Vec<&str> =
        page["records"].as_array().unwrap().iter().map(|r| r["observation_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["v-1", "v-2"]);
    assert!(!app.state.scoped_readers.knows("w"));
    // The phone receives what the set kept from it, below its cursor, as any device would.
    phone.sync(&app, &worker, 2).await;
    assert_eq!(phone.ids(), ["f-1", "h-north", "h-south", "v-1", "v-2"]);
}

/// The ids a manifest lists for download, sorted.
async fn downloads_after(app: &TestApp, token: &str, cursor: i64) -> (Vec<String>, i64) {
    let manifest = attachment_manifest(app, token, "phone", cursor).await;
    let mut ids: Vec<String> = manifest["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["operation"] == "download")
        .map(|o| o["attachment_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    (ids, manifest["current_version"].as_i64().unwrap())
}

/// A photo uploaded after a device's cursor, named by a record the device already holds, reaches
/// exactly the users who may see that record: read under the record's keys while the user's keys
/// stay as they were, and checked upload by upload once they changed after the cursor.
#[actix_web::test]
async fn an_upload_reaches_the_users_who_hold_a_record_that_names_it() {
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let north = create_user(&app, &admin, "wn", "read-write", json!({"district": ["north"]})).await;
    let east = create_user(&app, &admin, "we", "read-write", json!({"district": ["east"]})).await;
    set_rules(&app, &admin, district_rules()).await;
    let [north_photo, east_photo, own_photo, loose_photo] =
        ["north.jpg", "east.jpg", "own note.jpg", "loose.jpg"];
    push(
        &app,
        &admin,
        "admin-device",
        vec![
            record("h-north", "household", json!({"district": "north", "photo": {"filename": north_photo}})),
            record("h-east", "household", json!({"district": "east", "photo": {"filename": east_photo}})),
        ],
    )
    .await;
    // A record of the worker's own, of a form no rule gives anybody.
    push(&app, &north, "phone", vec![record("note-wn", "note", json!({"photo": own_photo}))]).await;
    // Both devices hold every record they may see, and no photo has arrived yet.
    let (ids, north_cursor) = downloads_after(&app, &north, 0).await;
    assert!(ids.is_empty(), "{ids:?}");
    let (_, east_cursor) = downloads_after(&app, &east, 0).await;

    for id in [north_photo, east_photo, own_photo, loose_photo] {
        let (status, body) = app
            .put_bytes(
                &admin,
                &format!("/attachments/{}", id.replace(' ', "%20")),
                id.as_bytes(),
                Some("image/jpeg"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let db = connect(&app.db_conn).await;
    let written: Vec<(String, String)> = db
        .query("SELECT key, attachment_id FROM scope_uploads ORDER BY attachment_id, key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(written.contains(&("@wn".to_owned(), own_photo.to_owned())), "{written:?}");
    assert!(written.contains(&("@admin".to_owned(), north_photo.to_owned())), "{written:?}");
    assert!(!written.iter().any(|(_, id)| id == loose_photo), "an upload no record names: {written:?}");

    let (ids, _) = downloads_after(&app, &north, north_cursor).await;
    assert_eq!(ids, [north_photo, own_photo]);
    let (ids, _) = downloads_after(&app, &east, east_cursor).await;
    assert_eq!(ids, [east_photo]);
    let (ids, _) = downloads_after(&app, &admin, north_cursor).await;
    assert_eq!(ids, [east_photo, loose_photo, north_photo, own_photo], "admins see every upload");

    // The north worker is given the east as well: after the old cursor, the east photo too
    // (its record comes again, and the uploads are checked one by one).
    set_attributes(&app, &admin, "wn", json!({"district": ["north", "east"]})).await;
    let (ids, _) = downloads_after(&app, &north, north_cursor).await;
    assert_eq!(ids, [east_photo, north_photo, own_photo]);
}

/// Seeded random uploads, records that name photos (pushed before or after the upload, moved
/// between districts, pointed at another photo or none), attribute changes, a set put again in
/// force and devices that ask for the manifest now and then or start over, under the district
/// rules. After every manifest a device must hold exactly the attachments its user may download
/// now: none missed (by either the keys' uploads or the check of every upload), none kept that
/// left its user's set (a `delete` for each), and every `download` one its user may have.
#[actix_web::test]
async fn attachment_manifests_miss_no_upload_and_leak_none_under_random_changes() {
    use rand::{Rng, SeedableRng};
    use std::collections::{BTreeSet, HashMap};

    const DISTRICTS: [&str; 3] = ["north", "east", "south"];
    const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
    struct Rec {
        created_by: String,
        form: &'static str,
        district: &'static str,
        photo: Option<String>,
    }
    let app = TestApp::spawn().await;
    let admin = app.admin_token().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_261_129);
    let mut attrs: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    let mut tokens = HashMap::new();
    for (i, w) in WORKERS.iter().enumerate() {
        let district = DISTRICTS[i];
        tokens.insert(*w, create_user(&app, &admin, w, "read-write", json!({"district": [district]})).await);
        attrs.insert(w, BTreeSet::from([district]));
    }
    set_rules(&app, &admin, district_rules()).await;
    let mut records: HashMap<String, Rec> = HashMap::new();
    let mut uploaded: HashMap<String, String> = HashMap::new();
    // Per worker: the manifest cursor and the attachments the device holds.
    let mut devices: HashMap<&str, (i64, BTreeSet<String>)> =
        WORKERS.iter().map(|w| (*w, (0, BTreeSet::new()))).collect();
    let photo_name = |i: u32| format!("p{i}.jpg");
    let (mut checks, mut fresh_manifests) = (0, 0);
    for step in 0..500 {
        let worker = WORKERS[rng.gen_range(0..WORKERS.len())];
        match rng.gen_range(0..100) {
            0..=19 => {
                let photo = photo_name(rng.gen_range(0..60));
                if uploaded.contains_key(&photo) {
                    continue;
                }
                let (uploader, token) =
                    if rng.gen_bool(0.5) { ("admin", &admin) } else { (worker, &tokens[worker]) };
                let (status, body) = app
                    .put_bytes(token, &format!("/attachments/{photo}"), photo.as_bytes(), Some("image/jpeg"))
                    .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                uploaded.insert(photo, uploader.to_owned());
            }
            20..=44 => {
                // A new record of the worker's, or the admin's (new or changed).
                let (by, token, id) = if rng.gen_bool(0.5) {
                    (worker, &tokens[worker], format!("r{step}"))
                } else {
                    let id = format!("r{}", rng.gen_range(0..step.max(1)));
                    let id = if records.contains_key(&id) { id } else { format!("r{step}") };
                    ("admin", &admin, id)
                };
                let created_by = records.get(&id).map_or(by.to_owned(), |r| r.created_by.clone());
                let form = if rng.gen_range(0..5) == 0 { "facility" } else { "household" };
                let district = DISTRICTS[rng.gen_range(0..DISTRICTS.len())];
                let photo = rng.gen_bool(0.8).then(|| photo_name(rng.gen_range(0..60)));
                let mut data = json!({"district": district});
                if let Some(p) = &photo {
                    data["photo"] = json!({"type": "image", "filename": p});
                }
                let body = push(&app, token, &format!("{by}-device"), vec![record(&id, form, data)]).await;
                assert!(body["errors"].as_array().is_none_or(|e| e.is_empty()), "{body}");
                records.insert(id, Rec { created_by, form, district, photo });
            }
            45..=52 => {
                let mut districts: BTreeSet<&str> =
                    DISTRICTS.iter().copied().filter(|_| rng.gen_bool(0.5)).collect();
                if districts.is_empty() {
                    districts.insert(DISTRICTS[rng.gen_range(0..DISTRICTS.len())]);
                }
                set_attributes(&app, &admin, worker, json!({"district": districts})).await;
                attrs.insert(worker, districts);
            }
            53..=54 => {
                // The same rules again: a new version, every user's keys start anew.
                set_rules(&app, &admin, district_rules()).await;
            }
            55..=57 => {
                devices.insert(worker, (0, BTreeSet::new()));
            }
            _ => {
                let (cursor, held) = devices.get_mut(worker).unwrap();
                let manifest =
                    attachment_manifest(&app, &tokens[worker], &format!("{worker}-device"), *cursor).await;
                fresh_manifests += usize::from(*cursor == 0);
                let sees = |r: &Rec| {
                    r.created_by == worker || r.form == "facility" || attrs[worker].contains(r.district)
                };
                let visible: BTreeSet<String> = uploaded
                    .iter()
                    .filter(|(id, uploader)| {
                        *uploader == worker
                            || records.values().any(|r| r.photo.as_ref() == Some(*id) && sees(r))
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                for op in manifest["operations"].as_array().unwrap() {
                    let id = op["attachment_id"].as_str().unwrap().to_owned();
                    if op["operation"] == "download" {
                        assert!(visible.contains(&id), "step {step}: {worker} was given {id}: {manifest}");
                        held.insert(id);
                    } else {
                        held.remove(&id);
                    }
                }
                *cursor = manifest["current_version"].as_i64().unwrap();
                let missed: Vec<&String> = visible.difference(held).collect();
                assert!(missed.is_empty(), "step {step}: {worker}'s device lacks {missed:?}: {manifest}");
                let kept: Vec<&String> = held.difference(&visible).collect();
                assert!(kept.is_empty(), "step {step}: {worker}'s device still holds {kept:?}: {manifest}");
                checks += 1;
            }
        }
    }
    assert!(checks > 80 && fresh_manifests > 3, "{checks} checks, {fresh_manifests} from 0");
}
