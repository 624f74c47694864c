//! Pix BR Code: the EMV-MPM payload behind a Pix QR code ("Pix Copia e Cola").
//!
//! Sources: BCB "Manual do BR Code" and "Manual de Padrões para Iniciação do Pix" as quoted
//! in `shared/notes/brcode.md` (§1 wire format and field table, §2 CRC16, §3 amount,
//! §4 txid, §5 text and length counting), with Stone's `ex-pix-brcode` as the reference
//! strict reader.
//!
//! # Reading ([`parse`])
//!
//! Strict, like Stone's validator, except that amounts in every form EMV allows are read
//! (`10`, `10.`, `0.9`, `.5`). Lengths count **characters** (Unicode scalar values) and the
//! CRC16 is taken over the **UTF-8 bytes**; the parser never slices a `&str` at a byte
//! offset derived from a length prefix, so truncated or multibyte input gives an error, not a
//! panic. Rules enforced, each reported by [`BrCodeError`] naming the EMV tag:
//!
//! - total size ≤ 512 bytes (UTF-8);
//! - TLV structure: 2-digit ID, 2-digit length, value; no duplicate top-level IDs;
//!   `00` first, `63` last;
//! - `00` = `01`; `01` (if present) is `11` or `12`; `52` four digits; `53` = `986`;
//!   `58` = `BR`; `59` 1..=25 chars; `60` 1..=15 chars; `61` (if present) 8 digits;
//! - `26` present with GUI `26-00` = `br.gov.bcb.pix` (any letter case), otherwise
//!   [`BrCodeError::NotPix`]; exactly one of key `26-01` (1..=77) and URL `26-25` (1..=77,
//!   without a scheme such as `https://`); description `26-02` (1..=72) only with a key;
//! - `54` (if present): digits with at most one `.` and at most 2 decimals, ≤ 13 chars,
//!   non-zero;
//! - `62` present with `62-05` (txid): 1..=25 of `[A-Za-z0-9]`, or `***`;
//! - `63` = CRC16 as **4 uppercase** hex digits. A lowercase CRC is rejected on read
//!   ([`BrCodeError::InvalidValue`] for tag `63`), as Stone's reader does (it compares with
//!   the uppercase rendering); no fixture marks a lowercase CRC as acceptable.
//!
//! # Writing ([`encode_static`], [`encode_dynamic`])
//!
//! Canonical output only, so that every payer app reads it the same way:
//!
//! - IDs in ascending order, `63` last, CRC uppercase and zero-padded (`0B0F`).
//! - Amount from integer centavos with exactly two decimals (`1234` → `12.34`); omitted when
//!   `None` or `0` (payer types the amount).
//! - Merchant name and city are **folded to the BR Code character set, uppercase**: letters
//!   lose their diacritics (`ã`→`A`, `ç`→`C`, via [`crate::codepage::fallback`]), are
//!   uppercased, anything outside `A-Z 0-9 $ % * + - . / :` and space is dropped (`&`, emoji),
//!   runs of spaces collapse, then the text is cut to 25 (name) / 15 (city) characters and
//!   trimmed. Uppercase is the BCB "alphanumeric" set (notes §5) and what bank apps display.
//!   After folding, characters equal bytes, so the length question of notes §5 disappears.
//! - Description (`26-02`): folded to printable ASCII (diacritics stripped, case kept) and
//!   cut so that key + description fit the 99 characters of template `26`.
//! - txid (`62-05`): every character outside `[A-Za-z0-9]` is removed, the rest is cut to
//!   its **first 25** characters; `None` or an empty result gives `***`. The charges'
//!   32-hex-char `transactionID`s therefore become their first 25 characters.
//! - A key (or URL) too long for template `26` is an error, never truncated.
//!
//! Every payload written is parsed back before it is returned; a payload that [`parse`]
//! would reject is never returned.

use serde::Serialize;
use thiserror::Error;

/// Maximum size of a whole BR Code in bytes (Stone `@max_size_in_bytes 512`, notes §1).
pub const MAX_PAYLOAD_BYTES: usize = 512;
/// The Pix GUI in `26-00` (notes §1 field table).
pub const PIX_GUI: &str = "br.gov.bcb.pix";

/// CRC-16/CCITT-FALSE as used by EMV-MPM field `63` (notes §2): polynomial 0x1021, initial
/// value 0xFFFF, no reflection, no final XOR. For a BR Code, `bytes` are the UTF-8 bytes of
/// the payload from its start through the literal `6304`. Check value: `b"123456789"` →
/// `0x29B1`.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Why a BR Code was rejected or could not be written. `tag` is the EMV ID, with
/// sub-fields written `26-01` (template `26`, ID `01`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BrCodeError {
    /// The payload is larger than [`MAX_PAYLOAD_BYTES`] (UTF-8 bytes).
    #[error("BR Code is {len} bytes long, the limit is {max}")]
    TooLong { len: usize, max: usize },
    /// The TLV structure is broken at character `at` (0-based, in characters).
    #[error("BR Code structure broken at character {at}: {reason}")]
    Tlv { at: usize, reason: String },
    /// A mandatory field is absent.
    #[error("field {tag} is mandatory but missing")]
    Missing { tag: String },
    /// A field occurs twice.
    #[error("field {tag} appears more than once")]
    Duplicate { tag: String },
    /// A field is longer than its maximum (lengths in characters).
    #[error("field {tag} is {len} characters long, the maximum is {max}")]
    FieldTooLong { tag: String, max: usize, len: usize },
    /// A field's value breaks a rule; `rule` says which.
    #[error("field {tag} is invalid: {rule}")]
    InvalidValue { tag: String, rule: String },
    /// The CRC16 in field `63` does not match the payload (both as 4 uppercase hex digits).
    #[error("CRC16 mismatch: the payload computes to {expected}, field 63 says {found}")]
    Crc { expected: String, found: String },
    /// Field `26` is absent or its GUI is not `br.gov.bcb.pix`: an EMV QR, but not Pix.
    #[error("not a Pix payload: merchant account template 26 with GUI br.gov.bcb.pix not found (GUI: {gui:?})")]
    NotPix { gui: Option<String> },
}

fn invalid(tag: &str, rule: impl Into<String>) -> BrCodeError {
    BrCodeError::InvalidValue { tag: tag.to_string(), rule: rule.into() }
}

/// A decoded and validated Pix BR Code. Text fields are exactly as in the payload (no
/// folding); `amount` is the raw field-54 text (use [`BrCode::amount_cents`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrCode {
    /// `01` Point of Initiation Method: `11` reusable, `12` single use.
    pub point_of_initiation: Option<String>,
    /// `26-00` GUI, as written (`br.gov.bcb.pix` in any case).
    pub gui: String,
    /// `26-01` Pix key (static BR Codes).
    pub key: Option<String>,
    /// `26-02` additional information shown to the payer (static only).
    pub description: Option<String>,
    /// `26-25` payload location without scheme (dynamic BR Codes).
    pub url: Option<String>,
    /// `52` Merchant Category Code, 4 digits (`0000` for Pix).
    pub mcc: String,
    /// `53` currency, ISO 4217 numeric (`986` = BRL).
    pub currency: String,
    /// `54` amount as written, e.g. `"123.45"`, `"10"`.
    pub amount: Option<String>,
    /// `58` country code (`BR`).
    pub country: String,
    /// `59` merchant name, ≤ 25 characters.
    pub merchant_name: String,
    /// `60` merchant city, ≤ 15 characters.
    pub merchant_city: String,
    /// `61` postal code (CEP), 8 digits.
    pub postal_code: Option<String>,
    /// `62-05` reference label (txid): `[A-Za-z0-9]{1,25}` or `***`.
    pub txid: String,
    /// `63` CRC16, 4 uppercase hex digits.
    pub crc: String,
}

impl BrCode {
    /// Field `54` in centavos. Reads every EMV amount form: `"10"` → 1000, `"10."` → 1000,
    /// `"0.9"` → 90, `".5"` → 50, `"123.45"` → 12345. `None` when absent or not a valid
    /// amount (more than 2 decimals, non-digits, overflow).
    pub fn amount_cents(&self) -> Option<u64> {
        self.amount.as_deref().and_then(amount_to_cents)
    }

    /// `true` when the payload points to a location (`26-25` URL): a dynamic Pix charge whose
    /// real amount and txid the payer's bank fetches. `false` for a static key payload.
    pub fn is_dynamic(&self) -> bool {
        self.url.is_some()
    }
}

fn amount_to_cents(s: &str) -> Option<u64> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || frac.len() > 2
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut cents: u64 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    if frac.len() == 1 {
        cents *= 10;
    }
    whole.checked_mul(100)?.checked_add(cents)
}

/// One TLV item: ID, value, and the character offset where the item starts.
struct Item {
    id: String,
    value: String,
    at: usize,
}

/// Splits `chars` (a payload or a template's value) into TLV items. `base` is the character
/// offset of `chars[0]` in the whole payload, for error positions.
fn split_tlv(chars: &[char], base: usize) -> Result<Vec<Item>, BrCodeError> {
    let mut items = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let at = base + i;
        if chars.len() - i < 4 {
            return Err(BrCodeError::Tlv {
                at,
                reason: format!("{} trailing characters cannot hold an ID and a length", chars.len() - i),
            });
        }
        let id: String = chars[i..i + 2].iter().collect();
        if !id.bytes().all(|b| b.is_ascii_digit()) || id.len() != 2 {
            return Err(BrCodeError::Tlv { at, reason: format!("ID {id:?} is not two digits") });
        }
        let len_c = &chars[i + 2..i + 4];
        if !len_c.iter().all(char::is_ascii_digit) {
            let len_s: String = len_c.iter().collect();
            return Err(BrCodeError::Tlv {
                at: at + 2,
                reason: format!("length {len_s:?} of field {id} is not two digits"),
            });
        }
        // Two ASCII digits (checked just above).
        let len = (len_c[0] as usize - '0' as usize) * 10 + (len_c[1] as usize - '0' as usize);
        let start = i + 4;
        if len == 0 {
            return Err(BrCodeError::Tlv { at, reason: format!("field {id} has length 00") });
        }
        if start + len > chars.len() {
            return Err(BrCodeError::Tlv {
                at,
                reason: format!(
                    "field {id} declares {len} characters but only {} remain (truncated?)",
                    chars.len() - start
                ),
            });
        }
        items.push(Item { id, value: chars[start..start + len].iter().collect(), at });
        i = start + len;
    }
    Ok(items)
}

fn take_unique(items: &[Item], id: &str, tag: &str) -> Result<Option<String>, BrCodeError> {
    let mut found = items.iter().filter(|it| it.id == id);
    let first = found.next().map(|it| it.value.clone());
    if found.next().is_some() {
        return Err(BrCodeError::Duplicate { tag: tag.to_string() });
    }
    Ok(first)
}

fn require(v: Option<String>, tag: &str) -> Result<String, BrCodeError> {
    v.ok_or_else(|| BrCodeError::Missing { tag: tag.to_string() })
}

fn check_len(tag: &str, v: &str, max: usize) -> Result<(), BrCodeError> {
    let len = v.chars().count();
    if len > max {
        return Err(BrCodeError::FieldTooLong { tag: tag.to_string(), max, len });
    }
    Ok(())
}

fn is_txid(s: &str) -> bool {
    s == "***" || (!s.is_empty() && s.chars().count() <= 25 && s.chars().all(|c| c.is_ascii_alphanumeric()))
}

fn check_amount(s: &str) -> Result<(), BrCodeError> {
    check_len("54", s, 13)?;
    match amount_to_cents(s) {
        None => Err(invalid("54", format!("{s:?} is not an amount (digits, one '.', at most 2 decimals)"))),
        Some(0) => Err(invalid("54", "amount must be non-zero when present (omit field 54 for an open amount)")),
        Some(_) => Ok(()),
    }
}

/// Parses and validates a Pix BR Code with the rules listed in the module documentation.
///
/// `payload` is the text of the QR code / "Copia e Cola" string, used as is (no trimming).
///
/// # Errors
/// The first rule broken, as a [`BrCodeError`]. Checks run in this order: size, TLV
/// structure, CRC field position and format, CRC value, then fields in ID order. Never
/// panics, whatever the input.
pub fn parse(payload: &str) -> Result<BrCode, BrCodeError> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(BrCodeError::TooLong { len: payload.len(), max: MAX_PAYLOAD_BYTES });
    }
    let chars: Vec<char> = payload.chars().collect();
    let items = split_tlv(&chars, 0)?;

    // 00 first, 63 last, no duplicates at the top level.
    match items.first() {
        Some(first) if first.id == "00" => {}
        _ => return Err(BrCodeError::Tlv { at: 0, reason: "the payload must start with field 00".into() }),
    }
    let last = items.last().expect("non-empty");
    if last.id != "63" {
        if items.iter().any(|it| it.id == "63") {
            return Err(BrCodeError::Tlv { at: last.at, reason: "field 63 (CRC16) must be the last field".into() });
        }
        return Err(BrCodeError::Missing { tag: "63".into() });
    }
    for (n, it) in items.iter().enumerate() {
        if items[..n].iter().any(|p| p.id == it.id) {
            return Err(BrCodeError::Duplicate { tag: it.id.clone() });
        }
    }

    // 63: CRC over UTF-8 bytes through "6304".
    let crc = last.value.clone();
    if crc.len() != 4 || !crc.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)) {
        return Err(invalid("63", format!("{crc:?} is not 4 uppercase hex digits")));
    }
    // Field 63 is the last item and 8 characters long, all ASCII: the covered bytes are
    // everything but the last 4 bytes. (No slicing at a length-derived offset of a
    // multibyte string: the tail is known to be ASCII.)
    let covered = &payload.as_bytes()[..payload.len() - 4];
    let expected = format!("{:04X}", crc16(covered));
    if expected != crc {
        return Err(BrCodeError::Crc { expected, found: crc });
    }

    let get = |id: &str| take_unique(&items, id, id);

    let pfi = require(get("00")?, "00")?;
    if pfi != "01" {
        return Err(invalid("00", format!("Payload Format Indicator must be 01, is {pfi:?}")));
    }
    let point_of_initiation = get("01")?;
    if let Some(p) = &point_of_initiation {
        if p != "11" && p != "12" {
            return Err(invalid("01", format!("Point of Initiation Method must be 11 or 12, is {p:?}")));
        }
    }

    // 26: Pix merchant account template.
    let mai_item = items.iter().find(|it| it.id == "26");
    let Some(mai_item) = mai_item else { return Err(BrCodeError::NotPix { gui: None }) };
    let mai_chars: Vec<char> = mai_item.value.chars().collect();
    let mai = split_tlv(&mai_chars, mai_item.at + 4)?;
    let sub = |id: &str| take_unique(&mai, id, id).map_err(|_| BrCodeError::Duplicate { tag: format!("26-{id}") });
    let gui = require(sub("00")?, "26-00")?;
    if !gui.eq_ignore_ascii_case(PIX_GUI) {
        return Err(BrCodeError::NotPix { gui: Some(gui) });
    }
    let key = sub("01")?;
    let description = sub("02")?;
    let url = sub("25")?;
    match (&key, &url) {
        (Some(_), Some(_)) => return Err(invalid("26", "a key (26-01) and a URL (26-25) are mutually exclusive")),
        (None, None) => return Err(BrCodeError::Missing { tag: "26-01".into() }),
        _ => {}
    }
    if let Some(k) = &key {
        check_len("26-01", k, 77)?;
    }
    if let Some(d) = &description {
        check_len("26-02", d, 72)?;
        if url.is_some() {
            return Err(invalid("26-02", "description is not allowed with a URL (26-25)"));
        }
    }
    if let Some(u) = &url {
        check_len("26-25", u, 77)?;
        if u.contains("://") {
            return Err(invalid("26-25", "URL must not carry a scheme such as https://"));
        }
    }

    let mcc = require(get("52")?, "52")?;
    if mcc.len() != 4 || !mcc.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("52", format!("Merchant Category Code must be 4 digits, is {mcc:?}")));
    }
    let currency = require(get("53")?, "53")?;
    if currency != "986" {
        return Err(invalid("53", format!("currency must be 986 (BRL), is {currency:?}")));
    }
    let amount = get("54")?;
    if let Some(a) = &amount {
        check_amount(a)?;
    }
    let country = require(get("58")?, "58")?;
    if country != "BR" {
        return Err(invalid("58", format!("country must be BR, is {country:?}")));
    }
    let merchant_name = require(get("59")?, "59")?;
    check_len("59", &merchant_name, 25)?;
    let merchant_city = require(get("60")?, "60")?;
    check_len("60", &merchant_city, 15)?;
    let postal_code = get("61")?;
    if let Some(pc) = &postal_code {
        if pc.len() != 8 || !pc.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("61", format!("postal code must be 8 digits, is {pc:?}")));
        }
    }

    let adf_item = items.iter().find(|it| it.id == "62");
    let Some(adf_item) = adf_item else { return Err(BrCodeError::Missing { tag: "62".into() }) };
    let adf_chars: Vec<char> = adf_item.value.chars().collect();
    let adf = split_tlv(&adf_chars, adf_item.at + 4)?;
    let txid = require(take_unique(&adf, "05", "62-05")?, "62-05")?;
    if !is_txid(&txid) {
        return Err(invalid("62-05", format!("txid {txid:?} must be 1 to 25 of [A-Za-z0-9], or ***")));
    }

    Ok(BrCode {
        point_of_initiation,
        gui,
        key,
        description,
        url,
        mcc,
        currency,
        amount,
        country,
        merchant_name,
        merchant_city,
        postal_code,
        txid,
        crc,
    })
}

/// What a static Pix BR Code is built from (see [`encode_static`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StaticPix {
    /// Pix key (e-mail, `+55…` phone, CPF/CNPJ digits or EVP UUID), written as is.
    pub key: String,
    /// Amount in centavos; `None` or `Some(0)` leaves the amount to the payer (no field 54).
    pub amount_cents: Option<u64>,
    /// Merchant name as the business spells it (accents and all); folded on output.
    pub merchant_name: String,
    /// Merchant city as spelled; folded on output.
    pub merchant_city: String,
    /// Reconciliation id; cleaned to `[A-Za-z0-9]{1,25}` or `***` on output.
    pub txid: Option<String>,
    /// Optional `26-02` text for the payer.
    pub description: Option<String>,
}

fn tlv(id: &str, value: &str) -> Result<String, BrCodeError> {
    let len = value.chars().count();
    if len > 99 {
        return Err(BrCodeError::FieldTooLong { tag: id.to_string(), max: 99, len });
    }
    // `{id}{len:02}{value}`, without the formatting machinery (every receipt runs this).
    let mut out = String::with_capacity(id.len() + 2 + value.len());
    out.push_str(id);
    out.push(char::from(b'0' + (len / 10) as u8));
    out.push(char::from(b'0' + (len % 10) as u8));
    out.push_str(value);
    Ok(out)
}

/// Folds text to the BR Code alphanumeric set, uppercase, cut to `max` characters (rule in
/// the module docs).
pub fn fold_upper(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut one = [0u8; 4];
    for c in text.chars() {
        let ascii: &str = if c.is_ascii() { c.encode_utf8(&mut one) } else { crate::codepage::fallback(c).unwrap_or("") };
        for a in ascii.chars() {
            let a = a.to_ascii_uppercase();
            let keep = a.is_ascii_uppercase() || a.is_ascii_digit() || "$%*+-./: ".contains(a);
            if !keep || (a == ' ' && (out.is_empty() || out.ends_with(' '))) {
                continue;
            }
            out.push(a);
        }
    }
    let cut: String = out.chars().take(max).collect();
    cut.trim_end().to_string()
}

fn fold_printable(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if (' '..='~').contains(&c) {
            out.push(c);
        } else if let Some(f) = crate::codepage::fallback(c) {
            out.push_str(f);
        }
    }
    let cut: String = out.trim().chars().take(max).collect();
    cut.trim_end().to_string()
}

/// The txid rule of [`encode_static`]: keep `[A-Za-z0-9]`, first 25, `***` when empty.
pub fn clean_txid(txid: Option<&str>) -> String {
    let t: String = txid.unwrap_or("").chars().filter(|c| c.is_ascii_alphanumeric()).take(25).collect();
    if t.is_empty() { "***".to_string() } else { t }
}

fn finish(mut body: String) -> Result<String, BrCodeError> {
    body.push_str("6304");
    let crc = crc16(body.as_bytes());
    body.push_str(&format!("{crc:04X}"));
    if body.len() > MAX_PAYLOAD_BYTES {
        return Err(BrCodeError::TooLong { len: body.len(), max: MAX_PAYLOAD_BYTES });
    }
    // Never hand out a payload our own reader rejects.
    parse(&body)?;
    Ok(body)
}

fn folded_name_city(name: &str, city: &str) -> Result<(String, String), BrCodeError> {
    let n = fold_upper(name, 25);
    let c = fold_upper(city, 15);
    if n.is_empty() {
        return Err(invalid("59", "merchant name is empty after folding to the BR Code character set"));
    }
    if c.is_empty() {
        return Err(invalid("60", "merchant city is empty after folding to the BR Code character set"));
    }
    Ok((n, c))
}

fn amount_field(amount_cents: Option<u64>) -> Result<String, BrCodeError> {
    match amount_cents {
        None | Some(0) => Ok(String::new()),
        Some(c) => tlv("54", &format!("{}.{:02}", c / 100, c % 100)),
    }
}

/// Writes a canonical static Pix BR Code (key in `26-01`) following the writing rules in
/// the module documentation: `000201` `26`{GUI, key, description} `52040000` `5303986`
/// [`54` amount] `5802BR` `59` name `60` city `62`{`05` txid} `6304`CRC.
///
/// # Errors
/// [`BrCodeError::InvalidValue`] for an empty key or a name/city that folds to nothing;
/// [`BrCodeError::FieldTooLong`] when the key (> 77 characters or with the GUI over the 99
/// of template `26`) does not fit; [`BrCodeError::TooLong`] for a payload over 512 bytes.
pub fn encode_static(p: &StaticPix) -> Result<String, BrCodeError> {
    let key = p.key.trim();
    if key.is_empty() {
        return Err(invalid("26-01", "Pix key is empty"));
    }
    check_len("26-01", key, 77)?;
    let head = format!("{}{}", tlv("00", PIX_GUI)?, tlv("01", key)?);
    let head_len = head.chars().count();
    if head_len > 99 {
        return Err(BrCodeError::FieldTooLong { tag: "26".into(), max: 99, len: head_len });
    }
    let mut mai = head;
    if let Some(d) = &p.description {
        // Room left in template 26 after "02" + 2-digit length.
        let room = (99 - head_len).saturating_sub(4).min(72);
        let d = fold_printable(d, room);
        if !d.is_empty() {
            mai.push_str(&tlv("02", &d)?);
        }
    }
    let (name, city) = folded_name_city(&p.merchant_name, &p.merchant_city)?;
    let mut body = String::new();
    body.push_str(&tlv("00", "01")?);
    body.push_str(&tlv("26", &mai)?);
    body.push_str(&tlv("52", "0000")?);
    body.push_str(&tlv("53", "986")?);
    body.push_str(&amount_field(p.amount_cents)?);
    body.push_str(&tlv("58", "BR")?);
    body.push_str(&tlv("59", &name)?);
    body.push_str(&tlv("60", &city)?);
    body.push_str(&tlv("62", &tlv("05", &clean_txid(p.txid.as_deref()))?)?);
    finish(body)
}

/// Writes a canonical dynamic Pix BR Code: `000201` `010212` (single use) `26`{GUI, `25`
/// URL} `52040000` `5303986` [`54` amount] `5802BR` `59` name `60` city `620705` `03***`
/// `6304`CRC. `url` is the payload location; a leading `https://` or `http://` is removed
/// (the BR Code carries it without scheme). Name and city are folded like
/// [`encode_static`]'s.
///
/// # Errors
/// [`BrCodeError::FieldTooLong`] for a URL over 77 characters; [`BrCodeError::InvalidValue`]
/// for an empty URL or a name/city that folds to nothing.
pub fn encode_dynamic(
    url: &str,
    amount_cents: Option<u64>,
    merchant_name: &str,
    merchant_city: &str,
) -> Result<String, BrCodeError> {
    let u = url.trim();
    let u = u.strip_prefix("https://").or_else(|| u.strip_prefix("http://")).unwrap_or(u);
    if u.is_empty() {
        return Err(invalid("26-25", "URL is empty"));
    }
    check_len("26-25", u, 77)?;
    let mai = format!("{}{}", tlv("00", PIX_GUI)?, tlv("25", u)?);
    let (name, city) = folded_name_city(merchant_name, merchant_city)?;
    let mut body = String::new();
    body.push_str(&tlv("00", "01")?);
    body.push_str(&tlv("01", "12")?);
    body.push_str(&tlv("26", &mai)?);
    body.push_str(&tlv("52", "0000")?);
    body.push_str(&tlv("53", "986")?);
    body.push_str(&amount_field(amount_cents)?);
    body.push_str(&tlv("58", "BR")?);
    body.push_str(&tlv("59", &name)?);
    body.push_str(&tlv("60", &city)?);
    body.push_str(&tlv("62", &tlv("05", "***")?)?);
    finish(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_check_value_and_bcb_example() {
        assert_eq!(crc16(b"123456789"), 0x29B1);
        // BCB example (bacen/pix-api#79): CRC of everything through "6304" is 1D3D.
        let p = "00020126580014br.gov.bcb.pix0136123e4567-e12b-12d1-a456-4266554400005204000053039865802BR5913Fulano de Tal6008BRASILIA62070503***6304";
        assert_eq!(crc16(p.as_bytes()), 0x1D3D);
    }

    #[test]
    fn amount_forms() {
        let cases = [("10", Some(1000)), ("10.", Some(1000)), ("0.9", Some(90)), ("123.45", Some(12345)), (".5", Some(50)), ("1.234", None), ("1,00", None), (".", None), ("", None)];
        for (s, want) in cases {
            assert_eq!(amount_to_cents(s), want, "{s:?}");
        }
    }

    #[test]
    fn never_panics_on_truncations_and_multibyte() {
        let p = "00020126580014br.gov.bcb.pix0136123e4567-e12b-12d1-a456-4266554400005204000053039865802BR5913Fulano de Tal6008BRASÍLIA62070503***6304B4F6";
        assert!(parse(p).is_ok());
        for (i, _) in p.char_indices() {
            assert!(parse(&p[..i]).is_err(), "prefix of {i} bytes accepted");
        }
        for junk in ["", "0", "00", "0002", "000201", "ÍÍÍÍÍÍÍÍ", "00ÍÍ", "0004ÍÍÍÍ6304ABCD", "6304"] {
            assert!(parse(junk).is_err(), "{junk:?}");
        }
        // Length prefix pointing into the middle of a multibyte character region.
        assert!(parse("0002ãã26999").is_err());
    }

    #[test]
    fn lowercase_crc_is_rejected_with_a_named_rule() {
        // Same as the BCB example with a valid CRC written in lowercase: CRC "1d3d".
        let p = "00020126580014br.gov.bcb.pix0136123e4567-e12b-12d1-a456-4266554400005204000053039865802BR5913Fulano de Tal6008BRASILIA62070503***63041d3d";
        let e = parse(p).unwrap_err();
        assert!(matches!(&e, BrCodeError::InvalidValue { tag, .. } if tag == "63"), "{e}");
    }

    #[test]
    fn errors_name_tags() {
        let good = encode_static(&StaticPix {
            key: "pix@example.com".into(),
            amount_cents: Some(1234),
            merchant_name: "Loja".into(),
            merchant_city: "Recife".into(),
            txid: Some("ABC".into()),
            description: None,
        })
        .unwrap();
        // Break the CRC.
        let mut bad = good.clone();
        let last = if bad.ends_with('0') { '1' } else { '0' };
        bad.pop();
        bad.push(last);
        assert!(matches!(parse(&bad), Err(BrCodeError::Crc { .. })));
        let msg = parse(&bad).unwrap_err().to_string();
        assert!(msg.contains("CRC16"), "{msg}");
    }

    fn fixture_charge_static() -> StaticPix {
        StaticPix {
            key: "4a23d596-2217-4ead-9bc4-96cb8e81973e".into(),
            amount_cents: Some(1_234_567),
            merchant_name: "Padaria & Confeitaria Nossa Senhora Aparecida do Norte 🍞".into(),
            merchant_city: "São José dos Campos do Sul".into(),
            txid: Some("635956be31135de9953857d7f18bde0e".into()),
            description: Some("Pão de queijo — 3x".into()),
        }
    }

    #[test]
    fn encode_static_is_canonical_and_parses() {
        let s = encode_static(&fixture_charge_static()).unwrap();
        let b = parse(&s).unwrap();
        assert_eq!(b.merchant_name, "PADARIA CONFEITARIA NOSSA");
        assert_eq!(b.merchant_city, "SAO JOSE DOS CA");
        assert_eq!(b.txid, "635956be31135de9953857d7f");
        assert_eq!(b.amount.as_deref(), Some("12345.67"));
        assert_eq!(b.amount_cents(), Some(1_234_567));
        assert_eq!(b.description.as_deref(), Some("Pao de queijo - 3x"));
        assert!(!b.is_dynamic());
        assert!(s.is_ascii());
        // Independent CRC: recompute over the bytes before the last 4 characters.
        assert_eq!(format!("{:04X}", crc16(&s.as_bytes()[..s.len() - 4])), b.crc);

        let no_amount = encode_static(&StaticPix { amount_cents: Some(0), txid: None, ..fixture_charge_static() }).unwrap();
        let b = parse(&no_amount).unwrap();
        assert_eq!(b.amount, None);
        assert_eq!(b.txid, "***");
        assert_eq!(clean_txid(Some("--")), "***");
    }

    #[test]
    fn encode_static_rejects_long_keys() {
        let e = encode_static(&StaticPix { key: "k".repeat(78), ..fixture_charge_static() }).unwrap_err();
        assert!(matches!(e, BrCodeError::FieldTooLong { ref tag, max: 77, len: 78 } if tag == "26-01"), "{e:?}");
        // 77 characters: 14+4 GUI + 4 + 77 = 99, still fits template 26.
        let s = encode_static(&StaticPix { key: "k".repeat(77), description: Some("x".into()), ..fixture_charge_static() }).unwrap();
        assert_eq!(parse(&s).unwrap().key.unwrap().len(), 77);
    }

    #[test]
    fn encode_dynamic_matches_fixture_style() {
        // The fixtures' first dynamic charge carries this payload (charges.jsonl line 1).
        let fixture = "00020101021226760014br.gov.bcb.pix2554pix.example.com/qr/v2/635956be31135de9953857d7f18bde0e52040000530398654049.905802BR5918PAGAMENTOS EXEMPLO6009SAO PAULO62070503***63042666";
        let ours = encode_dynamic(
            "https://pix.example.com/qr/v2/635956be31135de9953857d7f18bde0e",
            Some(990),
            "Pagamentos Exemplo",
            "São Paulo",
        )
        .unwrap();
        let (a, b) = (parse(fixture).unwrap(), parse(&ours).unwrap());
        assert!(b.is_dynamic());
        assert_eq!(a.url, b.url);
        assert_eq!(a.amount_cents(), b.amount_cents());
        assert_eq!(b.amount.as_deref(), Some("9.90"));
        assert_eq!(a.merchant_city, b.merchant_city);
        assert_eq!(a.merchant_name, b.merchant_name);
    }
}
