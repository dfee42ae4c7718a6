//! The admin portal's static files and the browser redirect of `GET /` (docs/api.md §17.9). The portal
//! itself is exercised in a real browser by portal-tests/ (make test).

use reqwest::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LOCATION};
use reqwest::{redirect, Method, StatusCode};
use serde_json::Value;

use crate::helpers::{assert_error, header, TestApp};

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder().redirect(redirect::Policy::none()).build().expect("client")
}

#[actix_web::test]
async fn root_redirects_browsers_and_answers_api_clients() {
    let app = TestApp::spawn_with(&[("TRUSTED_PROXIES", "127.0.0.1/32")]).await;
    let client = no_redirects();
    for accept in [BROWSER_ACCEPT, "text/html"] {
        let res = client.get(app.url("/")).header(ACCEPT, accept).send().await.expect("request");
        assert_eq!(res.status(), StatusCode::SEE_OTHER, "{accept}");
        assert_eq!(header(&res, LOCATION), "/portal/");
    }
    // Behind a path-prefixing proxy the redirect keeps the prefix.
    let res = client
        .get(app.url("/"))
        .header(ACCEPT, BROWSER_ACCEPT)
        .header("x-forwarded-prefix", "/synk")
        .send()
        .await
        .expect("request");
    assert_eq!(header(&res, LOCATION), "/synk/portal/");
    for accept in [None, Some("*/*"), Some("application/json"), Some("application/json, text/html")] {
        let mut req = client.get(app.url("/"));
        if let Some(a) = accept {
            req = req.header(ACCEPT, a);
        }
        let res = req.send().await.expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{accept:?}");
        let body: Value = res.json().await.expect("json");
        assert_eq!(body["service"], "synkronus");
    }
}

#[actix_web::test]
async fn a_prefix_from_an_untrusted_peer_is_ignored() {
    let app = TestApp::spawn().await;
    let res = no_redirects()
        .get(app.url("/"))
        .header(ACCEPT, BROWSER_ACCEPT)
        .header("x-forwarded-prefix", "/phish")
        .send()
        .await
        .expect("request");
    assert_eq!(header(&res, LOCATION), "/portal/");
}

#[actix_web::test]
async fn index_is_served_with_and_without_the_slash() {
    let app = TestApp::spawn().await;
    let client = no_redirects();
    let mut bodies = Vec::new();
    for path in ["/portal", "/portal/", "/portal/index.html"] {
        let res = client.get(app.url(path)).send().await.expect("request");
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        assert_eq!(header(&res, CONTENT_TYPE), "text/html; charset=utf-8");
        assert_eq!(header(&res, CACHE_CONTROL), "no-cache");
        assert!(header(&res, "content-security-policy").contains("default-src 'self'"));
        bodies.push(res.text().await.expect("body"));
    }
    assert!(bodies.iter().all(|b| b == &bodies[0]));
    // Relative URLs resolve under /portal/ from either address.
    assert!(bodies[0].contains(r#"<base href="/portal/">"#), "{}", bodies[0]);
    assert!(bodies[0].contains(r#"src="app.js""#));
    // The portal lives at the root only.
    let (status, body) = app.call(Method::GET, "/api/portal", None, None).await;
    assert_error(status, &body, 404, "NOT_FOUND");
}

#[actix_web::test]
async fn assets_have_types_etags_and_revalidate() {
    let app = TestApp::spawn().await;
    for (file, content_type) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("api.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let res = app.send(Method::GET, &format!("/portal/{file}"), None, None).await;
        assert_eq!(res.status(), StatusCode::OK, "{file}");
        assert_eq!(header(&res, CONTENT_TYPE), content_type);
        assert_eq!(header(&res, CACHE_CONTROL), "no-cache");
        let etag = header(&res, ETAG).to_owned();
        assert_eq!(etag.len(), 66, "{etag}");
        assert!(!res.bytes().await.expect("body").is_empty());
        let again = app.client.get(app.url(&format!("/portal/{file}"))).header(IF_NONE_MATCH, &etag).send();
        let again = again.await.expect("request");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{file}");
        assert_eq!(header(&again, ETAG), etag);
    }
    let head = app.send(Method::HEAD, "/portal/app.css", None, None).await;
    assert_eq!(head.status(), StatusCode::OK);
}

#[actix_web::test]
async fn unknown_files_and_methods() {
    let app = TestApp::spawn().await;
    for path in ["/portal/nope.js", "/portal/..%2FCargo.toml", "/portal/a/b.js"] {
        let (status, body) = app.call(Method::GET, path, None, None).await;
        assert_error(status, &body, 404, "NOT_FOUND");
    }
    let (status, body) = app.call(Method::POST, "/portal/app.js", None, None).await;
    assert_error(status, &body, 405, "METHOD_NOT_ALLOWED");
}
