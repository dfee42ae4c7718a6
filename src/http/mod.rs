//! The HTTP surface: one routes table, served at the root, under `/api` and under `/api/v1`.

pub mod admin;
pub mod attachments;
pub mod auth;
pub mod body_budget;
pub mod bundles;
pub mod common;
pub mod compress;
pub mod context;
pub mod cors;
pub mod export;
pub mod extract;
pub mod formspecs;
pub mod health;
pub mod metrics;
pub mod observations;
pub mod openapi;
pub mod portal;
pub mod pull_body;
pub mod routing;
pub mod scopes;
pub mod sync;
pub mod users;
pub mod wire;

use actix_web::web;

/// Every route of the API (docs/api.md), registered once per prefix by `configure`.
fn api_routes(cfg: &mut web::ServiceConfig) {
    health::routes(cfg);
    auth::routes(cfg);
    users::routes(cfg);
    sync::routes(cfg);
    observations::routes(cfg);
    admin::routes(cfg);
    scopes::routes(cfg);
    bundles::routes(cfg);
    formspecs::routes(cfg);
    attachments::routes(cfg);
    export::routes(cfg);
    metrics::routes(cfg);
    openapi::routes(cfg);
}

/// `/api/v1` before `/api` so that the longer prefix wins; `GET /` and the portal exist only at
/// the root.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::scope("/api/v1").configure(api_routes))
        .service(web::scope("/api").configure(api_routes))
        .service(routing::resource("/", "GET, HEAD").route(routing::get().to(health::root)))
        .configure(portal::routes)
        .configure(api_routes);
}
