//! `Content-Encoding: gzip` for the JSON answers that opt in (docs/api.md §1.7): pull pages and
//! listings. Opt-in per handler rather than a middleware over everything, because downloads
//! (attachments, bundle files, exports) are often compressed already and are served with `Range`
//! and strong `ETag`s that an encoding would invalidate.

use std::io::Write;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::http::header::{self, AcceptEncoding, Encoding, Header, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;

/// Chosen by measurement (docs/benchmarks-history.md, "Pull: bytes and CPU per record"): level 1 takes a pull
/// page of survey-like records from 1,452 to 228 bytes per record for 1–2 µs of server CPU per
/// record (about +18 %); zlib's level 6 packs 2.7 times tighter than its level 1 but costs 13
/// times the CPU, several times what the whole page costs.
const LEVEL: u32 = 1;

/// Below this a body gains little and the gzip framing (18 bytes) can make it larger.
const MIN_BYTES: usize = 1024;

/// Whether the request names gzip as acceptable, honouring q-values (`gzip;q=0` refuses it, and an
/// `identity` ranked above gzip keeps the body plain). `*` alone does not count: a client that
/// never named an encoding gets what it got before compression existed.
pub fn wants_gzip(req: &HttpRequest) -> bool {
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

/// For a `200 application/json` body of at least [`MIN_BYTES`] that is sent as it is made (a pull
/// page, docs/api.md §8.2), compressed with a [`GzipStream`] when `gzip` ([`wants_gzip`]): the
/// headers [`negotiated`] would have set on it whole.
pub fn streamed(req: &HttpRequest, res: &mut HttpResponseBuilder, gzip: bool) {
    if req.headers().contains_key(header::ACCEPT_ENCODING) {
        res.append_header((header::VARY, HeaderValue::from_static("accept-encoding")));
    }
    if gzip {
        res.insert_header((header::CONTENT_ENCODING, HeaderValue::from_static("gzip")));
    }
}

/// gzip of a body that is sent in pieces as it is made: the same level and the same decoded
/// bytes as [`negotiated`]'s. The compressor decides when output is due, so a piece in may give
/// nothing out yet; nothing is flushed early, which would cost bytes on the wire.
pub struct GzipStream {
    encoder: GzEncoder<Vec<u8>>,
}

impl Default for GzipStream {
    fn default() -> Self {
        GzipStream { encoder: GzEncoder::new(Vec::new(), Compression::new(LEVEL)) }
    }
}

impl GzipStream {
    /// Compresses `plain`; returns the compressed bytes that are ready (possibly none).
    pub fn push(&mut self, plain: &[u8]) -> std::io::Result<Bytes> {
        self.encoder.write_all(plain)?;
        // A page's records pack to about a sixth: room for what one piece usually gives.
        let room = Vec::with_capacity(plain.len() / 4);
        Ok(Bytes::from(std::mem::replace(self.encoder.get_mut(), room)))
    }

    /// The rest of the compressed stream, with gzip's trailer.
    pub fn finish(self) -> std::io::Result<Bytes> {
        self.encoder.finish().map(Bytes::from)
    }
}

#[tracing::instrument(level = "debug", skip_all, fields(bytes = plain.len()))]
fn gzip(plain: &[u8]) -> std::io::Result<Vec<u8>> {
    // JSON of records packs to roughly a sixth; reserving a quarter avoids regrowth.
    let mut encoder = GzEncoder::new(Vec::with_capacity(plain.len() / 4), Compression::new(LEVEL));
    encoder.write_all(plain)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn a_body_gzipped_in_pieces_decodes_to_the_whole_body() {
        let body: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{{\"n\":{i},\"v\":\"x{}\"}},", i % 7).into_bytes())
            .collect();
        let mut stream = GzipStream::default();
        let mut packed = Vec::new();
        for piece in body.chunks(7_919) {
            packed.extend_from_slice(&stream.push(piece).unwrap());
        }
        packed.extend_from_slice(&stream.finish().unwrap());
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(packed.as_slice()).read_to_end(&mut decoded).unwrap();
        assert_eq!(decoded, body);
        assert!(packed.len() * 4 < body.len(), "{} of {} bytes", packed.len(), body.len());
    }
}
