//! `Content-Encoding: gzip` for the JSON answers that opt in (docs/api.md §1.7): pull pages and
//! listings. Opt-in per handler rather than a middleware over everything, because downloads
//! (attachments, bundle files, exports) are often compressed already and are served with `Range`
//! and strong `ETag`s that an encoding would invalidate.

use std::io::Write;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::http::header::{self, AcceptEncoding, Encoding, Header, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use flate2::write::GzEncoder;
use flate2::Compression;

/// Chosen by measurement (BENCHMARKS.md, "Pull: bytes and CPU per record"): level 1 takes a pull
/// page of survey-like records from 1,452 to 228 bytes per record for 1–2 µs of server CPU per
/// record (about +18 %); zlib's level 6 packs 2.7 times tighter than its level 1 but costs 13
/// times the CPU, several times what the whole page costs.
const LEVEL: u32 = 1;

/// Below this a body gains little and the gzip framing (18 bytes) can make it larger.
const MIN_BYTES: usize = 1024;

/// Whether the request names gzip as acceptable, honouring q-values (`gzip;q=0` refuses it, and an
/// `identity` ranked above gzip keeps the body plain). `*` alone does not count: a client that
/// never named an encoding gets what it got before compression existed.
fn wants_gzip(req: &HttpRequest) -> bool {
    let Ok(accept) = AcceptEncoding::parse(req) else {
        return false;
    };
    let offered = [Encoding::gzip(), Encoding::identity()];
    accept.negotiate(offered.iter()) == Some(Encoding::gzip())
}

/// `res` gzip-encoded when the request accepts gzip and `res` is a complete `application/json`
/// 200 body of at least [`MIN_BYTES`] with no `ETag` or encoding of its own. A request that sent
/// `Accept-Encoding` gets `Vary: Accept-Encoding` whichever way it went; a request without the
/// header gets `res` unchanged, byte for byte.
pub fn negotiated(req: &HttpRequest, mut res: HttpResponse) -> HttpResponse {
    if !req.headers().contains_key(header::ACCEPT_ENCODING) {
        return res;
    }
    res.headers_mut().append(header::VARY, HeaderValue::from_static("accept-encoding"));
    let eligible = res.status() == StatusCode::OK
        && !res.headers().contains_key(header::CONTENT_ENCODING)
        && !res.headers().contains_key(header::ETAG)
        && res
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !eligible || !wants_gzip(req) {
        return res;
    }
    let (res, body) = res.into_parts();
    let plain = match body.try_into_bytes() {
        Ok(bytes) => bytes,
        Err(body) => return res.set_body(body),
    };
    if plain.len() < MIN_BYTES {
        return res.set_body(BoxBody::new(plain));
    }
    match gzip(&plain) {
        Ok(packed) => {
            let mut res = res.set_body(BoxBody::new(packed));
            res.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            res
        }
        // Writing into memory does not fail; should it, the plain body is still a right answer.
        Err(_) => res.set_body(BoxBody::new(plain)),
    }
}

#[tracing::instrument(level = "debug", skip_all, fields(bytes = plain.len()))]
fn gzip(plain: &[u8]) -> std::io::Result<Vec<u8>> {
    // JSON of records packs to roughly a sixth; reserving a quarter avoids regrowth.
    let mut encoder = GzEncoder::new(Vec::with_capacity(plain.len() / 4), Compression::new(LEVEL));
    encoder.write_all(plain)?;
    encoder.finish()
}
