//! JSON text as serde_json reads and writes it: the one scanner under the canonical text of
//! pushes (`sync::canonical`) and the export's reading of stored text (`export::projection`).
//!
//! The canonical text of a value is what `serde_json::to_string` writes for the `Value` parsed
//! from it (with `arbitrary_precision`): compact, object keys in byte order with the last of
//! repeated keys kept, strings with serde_json's escapes, numbers verbatim but for an exponent,
//! which it writes as `e` with a sign (docs/api.md §8.6). Pushes store `data` and `geolocation`
//! in that form and exports read it back, so both need to know, token by token, whether text is
//! already written that way: the push writer copies such a token, the export slices it instead
//! of parsing. That knowledge lives here once: [`Scanner`] classifies every string and number it
//! reads against [`write_string`] and [`write_number`], the writers next to it.
//!
//! The scanner is strict: it reads exactly JSON's grammar and fails (`None`) at the first byte
//! that is not JSON, so whatever it accepts was JSON, whoever handed it the text.

use std::borrow::Cow;

/// How a string token is written compared with what serde_json writes for its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringForm {
    /// No escapes: the text between the quotes is the value.
    Plain,
    /// Only the escapes serde_json writes for these characters: written as it stands, decoded
    /// with [`unescape_canonical`].
    Canonical,
    /// Some escape serde_json writes otherwise (`\/`, `\u0041`, a surrogate pair, upper-case
    /// hex): decoded by serde_json's parser, written again with [`write_string`].
    Rewrite,
}

/// A string read by [`Scanner::string`], quotes included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StringToken<'a> {
    text: &'a str,
    start: usize,
    form: StringForm,
    nul: bool,
}

impl<'a> StringToken<'a> {
    /// Where it starts in the scanned text (its opening quote).
    pub fn start(&self) -> usize {
        self.start
    }

    /// One past its closing quote.
    pub fn end(&self) -> usize {
        self.start + self.text.len()
    }

    /// With its quotes.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The text between the quotes.
    pub fn inner(&self) -> &'a str {
        &self.text[1..self.text.len() - 1]
    }

    pub fn form(&self) -> StringForm {
        self.form
    }

    /// It holds an escaped NUL (`\u0000`), which the database cannot store in text.
    pub fn has_nul(&self) -> bool {
        self.nul
    }

    /// The value of a [`StringForm::Plain`] or [`StringForm::Canonical`] string; `None` for a
    /// string that is not canonical.
    pub fn canonical_value(&self) -> Option<Cow<'a, str>> {
        match self.form {
            StringForm::Plain => Some(Cow::Borrowed(self.inner())),
            StringForm::Canonical => {
                let mut out = String::with_capacity(self.text.len());
                unescape_canonical(self.inner(), &mut out);
                Some(Cow::Owned(out))
            }
            StringForm::Rewrite => None,
        }
    }
}

/// A number read by [`Scanner::number`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumberToken<'a> {
    text: &'a str,
    start: usize,
    canonical: bool,
}

impl<'a> NumberToken<'a> {
    pub fn start(&self) -> usize {
        self.start
    }

    pub fn end(&self) -> usize {
        self.start + self.text.len()
    }

    pub fn text(&self) -> &'a str {
        self.text
    }

    /// As serde_json writes it (see [`write_number`]).
    pub fn is_canonical(&self) -> bool {
        self.canonical
    }
}

/// `true`, `false` or `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Literal {
    True,
    False,
    Null,
}

/// A cursor over JSON text, reading one token at a time. Callers walk the structure (brackets,
/// colons, commas) with [`Scanner::eat`], and the tokens with the readers below.
#[derive(Debug, Clone)]
pub struct Scanner<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(text: &'a str) -> Self {
        Scanner { text, pos: 0 }
    }

    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The byte the scanner is at.
    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn at_end(&self) -> bool {
        self.pos == self.text.len()
    }

    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// Steps over `byte` if it is the next one.
    #[inline]
    pub fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    /// Steps over JSON's whitespace: canonical text has none.
    #[inline]
    pub fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// The literal at the scanner.
    #[inline]
    pub fn literal(&mut self) -> Option<Literal> {
        let (word, literal): (&str, _) = match self.peek()? {
            b't' => ("true", Literal::True),
            b'f' => ("false", Literal::False),
            b'n' => ("null", Literal::Null),
            _ => return None,
        };
        let end = self.pos + word.len();
        (self.text.as_bytes().get(self.pos..end)? == word.as_bytes()).then(|| {
            self.pos = end;
            literal
        })
    }

    /// The number at the scanner: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, not followed
    /// by a digit.
    #[inline]
    pub fn number(&mut self) -> Option<NumberToken<'a>> {
        let bytes = self.text.as_bytes();
        let digits = |pos: &mut usize| {
            let from = *pos;
            while bytes.get(*pos).is_some_and(u8::is_ascii_digit) {
                *pos += 1;
            }
            *pos - from
        };
        let start = self.pos;
        let mut pos = start;
        if bytes.get(pos) == Some(&b'-') {
            pos += 1;
        }
        match bytes.get(pos)? {
            b'0' => pos += 1,
            b'1'..=b'9' => {
                digits(&mut pos);
            }
            _ => return None,
        }
        if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            if digits(&mut pos) == 0 {
                return None;
            }
        }
        let mut canonical = true;
        if let Some(&marker @ (b'e' | b'E')) = bytes.get(pos) {
            pos += 1;
            let signed = matches!(bytes.get(pos), Some(b'+' | b'-'));
            if signed {
                pos += 1;
            }
            if digits(&mut pos) == 0 {
                return None;
            }
            canonical = marker == b'e' && signed;
        }
        // A digit straight after "0" is not JSON.
        if bytes.get(pos).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        self.pos = pos;
        Some(NumberToken { text: &self.text[start..pos], start, canonical })
    }

    /// The string at the scanner, classified against [`write_string`].
    #[inline]
    pub fn string(&mut self) -> Option<StringToken<'a>> {
        let bytes = self.text.as_bytes();
        let start = self.pos;
        if bytes.get(start) != Some(&b'"') {
            return None;
        }
        let mut pos = start + 1;
        let mut form = StringForm::Plain;
        let mut nul = false;
        loop {
            pos = plain_run(bytes, pos);
            match *bytes.get(pos)? {
                b'"' => {
                    self.pos = pos + 1;
                    return Some(StringToken { text: &self.text[start..self.pos], start, form, nul });
                }
                b'\\' => {
                    let (len, escape) = read_escape(bytes.get(pos + 1..)?)?;
                    let this = match escape {
                        Escape::Canonical => StringForm::Canonical,
                        Escape::Nul => {
                            nul = true;
                            StringForm::Canonical
                        }
                        Escape::Rewrite => StringForm::Rewrite,
                    };
                    if this == StringForm::Rewrite || form == StringForm::Plain {
                        form = this;
                    }
                    pos += 1 + len;
                }
                // A raw control character.
                _ => return None,
            }
        }
    }
}

/// Where the run of bytes a string holds as they are (no `"`, `\\` or control character) that
/// starts at `pos` ends. 32 bytes at a time, with no early exit inside a block so that the
/// compiler turns the test into a few vector instructions: the free-text fields that make up
/// most of a record's `data` are long runs, and this loop was the export scan's largest cost
/// byte by byte. (Words of eight bytes with bit tricks, or a bit mask per block, measured slower.)
#[inline]
fn plain_run(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(block) = bytes.get(pos..pos + 32) {
        if block.iter().fold(false, |special, &b| special | (b < 0x20) | (b == b'"') | (b == b'\\')) {
            break;
        }
        pos += 32;
    }
    while bytes.get(pos).is_some_and(|&b| b >= 0x20 && b != b'"' && b != b'\\') {
        pos += 1;
    }
    pos
}

enum Escape {
    /// Written as serde_json writes the character.
    Canonical,
    /// `\u0000`: canonical, and a NUL.
    Nul,
    Rewrite,
}

/// The escape after a backslash: its length and how it compares with what serde_json writes for
/// its character (the table [`write_string`] writes from). `None` when it is not JSON.
#[inline]
fn read_escape(after: &[u8]) -> Option<(usize, Escape)> {
    match *after.first()? {
        b'u' => {
            let hex = after.get(1..5)?;
            let mut code = 0u32;
            for &digit in hex {
                code = code * 16 + char::from(digit).to_digit(16)?;
            }
            let canonical = usize::try_from(code).ok().and_then(|c| ESCAPES.get(c)).is_some_and(|&e| {
                e == b'u' && hex[..2] == *b"00" && !hex[2..].iter().any(u8::is_ascii_uppercase)
            });
            let escape = match (canonical, code) {
                (true, 0) => Escape::Nul,
                (true, _) => Escape::Canonical,
                (false, _) => Escape::Rewrite,
            };
            Some((5, escape))
        }
        short @ (b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
            // Canonical when serde_json writes some character with this escape (it writes `/`
            // as it is).
            let canonical = ESCAPES.contains(&short);
            Some((1, if canonical { Escape::Canonical } else { Escape::Rewrite }))
        }
        _ => None,
    }
}

/// What serde_json writes for each byte below 0x60 that it escapes: the letter after the
/// backslash (`u` for `\u00xx`), 0 for bytes written as they are (and every byte from 0x60 on).
const ESCAPES: [u8; 0x60] = {
    let mut table = [0u8; 0x60];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0A] = b'n';
    table[0x0C] = b'f';
    table[0x0D] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// A string as serde_json writes it: `"` and `\` escaped, the control characters as `\b`, `\t`,
/// `\n`, `\f`, `\r` or `\u00xx`, everything else as it is.
pub fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut run = 0;
    for (i, byte) in s.bytes().enumerate() {
        let escape = match ESCAPES.get(usize::from(byte)) {
            Some(&e) if e != 0 => e,
            _ => continue,
        };
        out.push_str(&s[run..i]);
        run = i + 1;
        out.push('\\');
        out.push(char::from(escape));
        if escape == b'u' {
            out.push_str("00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        }
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Decodes the inside of a string the scanner found [`StringForm::Canonical`]: its escapes are
/// the short ones and `\u00xx` in lower-case hex (any other text is not what this reads).
pub fn unescape_canonical(inner: &str, out: &mut String) {
    fn hex(digit: u8) -> u8 {
        if digit <= b'9' {
            digit - b'0'
        } else {
            digit - b'a' + 10
        }
    }
    let mut rest = inner;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let b = rest.as_bytes();
        let (c, len) = match b[at + 1] {
            b'b' => ('\u{8}', 2),
            b'f' => ('\u{c}', 2),
            b'n' => ('\n', 2),
            b'r' => ('\r', 2),
            b't' => ('\t', 2),
            b'u' => (char::from(hex(b[at + 4]) << 4 | hex(b[at + 5])), 6),
            // `\"` and `\\`.
            other => (char::from(other), 2),
        };
        out.push(c);
        rest = &rest[at + len..];
    }
    out.push_str(rest);
}

/// A number as serde_json's `arbitrary_precision` writes it: its text, but for an exponent,
/// which is written as a lower-case `e` followed by an explicit sign.
pub fn write_number(out: &mut String, number: &str) {
    match number.find(['e', 'E']) {
        Some(at) => {
            out.push_str(&number[..at]);
            out.push('e');
            let exponent = &number[at + 1..];
            if !exponent.starts_with(['+', '-']) {
                out.push('+');
            }
            out.push_str(exponent);
        }
        None => out.push_str(number),
    }
}

#[cfg(test)]
mod tests;
