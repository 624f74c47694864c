//! `pixgate brcode decode|encode`: the Pix BR Code reader and writer of `render::brcode`
//! on the command line, for support staff checking a "Pix Copia e Cola" string or making
//! one by hand.
//!
//! - `pixgate brcode decode PAYLOAD` (or `-` to read it from stdin, one trailing line end
//!   removed): the fields as JSON on stdout, exit 0; or the [`BrCodeError`] on stderr (it
//!   names the EMV tag and the rule broken), exit 1.
//! - `pixgate brcode encode --key K --amount-cents N --name NAME --city CITY [--txid T]
//!   [--description D]` writes a static payload, `--url URL` instead of `--key` a dynamic
//!   one; the payload on stdout, exit 0, or the error on stderr, exit 1.
//!
//! Every rule (validation, canonical writing, folding of name and city) is
//! `render::brcode`'s; this module only reads arguments and prints.

use clap::{ArgGroup, Args, Subcommand};
use render::brcode::{self, BrCode, BrCodeError, StaticPix};
use serde::Serialize;
use std::io::{Read, Write};

/// `pixgate brcode …` subcommands.
#[derive(Debug, Subcommand)]
pub enum BrcodeCmd {
    /// Parse and validate a BR Code; print its fields as JSON (exit 0) or the rule it breaks (exit 1).
    Decode {
        /// The payload as is (quote it: it holds spaces), or `-` to read it from stdin.
        payload: String,
    },
    /// Write a canonical Pix BR Code from its parts (static with --key, dynamic with --url).
    Encode(EncodeArgs),
}

/// What `pixgate brcode encode` builds a payload from.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("account").required(true).args(["key", "url"])))]
pub struct EncodeArgs {
    /// Pix key (e-mail, +55 phone, CPF/CNPJ digits or EVP UUID): a static BR Code (26-01).
    #[arg(long)]
    pub key: Option<String>,
    /// Payload location of a dynamic charge (26-25), e.g. `pix.example.com/qr/v2/…`; a leading
    /// `https://` is removed. The txid is then `***` (the payer's bank fetches it).
    #[arg(long, conflicts_with_all = ["txid", "description"])]
    pub url: Option<String>,
    /// Amount in centavos (field 54, written with two decimals); 0 or absent: the payer types it.
    #[arg(long)]
    pub amount_cents: Option<u64>,
    /// Merchant name (59); folded to the BR Code character set, uppercase, 25 characters.
    #[arg(long)]
    pub name: String,
    /// Merchant city (60); folded like the name, 15 characters.
    #[arg(long)]
    pub city: String,
    /// Reconciliation id (62-05); `[A-Za-z0-9]` kept, first 25; absent: `***`.
    #[arg(long)]
    pub txid: Option<String>,
    /// Text for the payer (26-02, static only); folded to printable ASCII.
    #[arg(long)]
    pub description: Option<String>,
}

/// The JSON `decode` prints: every field of [`BrCode`] (null when absent) plus the amount in
/// centavos and whether the payload is static or dynamic.
#[derive(Debug, Serialize)]
pub struct Decoded {
    /// `static` (key in 26-01) or `dynamic` (URL in 26-25).
    pub kind: &'static str,
    /// Field 54 in centavos ([`BrCode::amount_cents`]); null when the payer types the amount.
    pub amount_cents: Option<u64>,
    /// The parsed fields, as in the payload.
    #[serde(flatten)]
    pub fields: BrCode,
}

impl From<BrCode> for Decoded {
    fn from(b: BrCode) -> Self {
        Decoded { kind: if b.is_dynamic() { "dynamic" } else { "static" }, amount_cents: b.amount_cents(), fields: b }
    }
}

/// Why the command failed: the BR Code's own error, or stdin unreadable.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The payload breaks a rule, or the parts cannot make one.
    #[error("{}", describe(.0))]
    BrCode(#[from] BrCodeError),
    /// Reading the payload from stdin failed (not UTF-8, I/O).
    #[error("cannot read the payload from stdin: {0}")]
    Stdin(#[from] std::io::Error),
}

/// `field 59 is 26 characters long, the maximum is 25 (FieldTooLong, tag 59)`: the message
/// plus the error's type and the EMV tag, for scripts that grep.
fn describe(e: &BrCodeError) -> String {
    let (kind, tag) = match e {
        BrCodeError::TooLong { .. } => ("TooLong", None),
        BrCodeError::Tlv { .. } => ("Tlv", None),
        BrCodeError::Missing { tag } => ("Missing", Some(tag.as_str())),
        BrCodeError::Duplicate { tag } => ("Duplicate", Some(tag.as_str())),
        BrCodeError::FieldTooLong { tag, .. } => ("FieldTooLong", Some(tag.as_str())),
        BrCodeError::InvalidValue { tag, .. } => ("InvalidValue", Some(tag.as_str())),
        BrCodeError::Crc { .. } => ("Crc", Some("63")),
        BrCodeError::NotPix { .. } => ("NotPix", Some("26-00")),
    };
    match tag {
        Some(t) => format!("{e} ({kind}, tag {t})"),
        None => format!("{e} ({kind})"),
    }
}

/// The payload argument, or stdin for `-` with one trailing `\n` / `\r\n` removed (what
/// `echo` and editors add; a BR Code never ends in one).
fn payload_arg(arg: &str) -> Result<String, CliError> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    Ok(s)
}

/// Parses `payload` (see the module docs for `-`).
///
/// # Errors
/// [`CliError::BrCode`] with the first rule broken; [`CliError::Stdin`].
pub fn decode(payload: &str) -> Result<Decoded, CliError> {
    Ok(brcode::parse(&payload_arg(payload)?)?.into())
}

/// Writes the payload `args` describe: [`brcode::encode_dynamic`] with `--url`, else
/// [`brcode::encode_static`].
///
/// # Errors
/// [`CliError::BrCode`]: a key or URL too long or empty, a name or city that folds to nothing.
pub fn encode(args: &EncodeArgs) -> Result<String, CliError> {
    let payload = match (&args.url, &args.key) {
        (Some(url), _) => brcode::encode_dynamic(url, args.amount_cents, &args.name, &args.city)?,
        (None, key) => brcode::encode_static(&StaticPix {
            key: key.clone().unwrap_or_default(),
            amount_cents: args.amount_cents,
            merchant_name: args.name.clone(),
            merchant_city: args.city.clone(),
            txid: args.txid.clone(),
            description: args.description.clone(),
        })?,
    };
    Ok(payload)
}

/// Runs `cmd`, printing its result to stdout or its error to stderr. Returns the process
/// exit code: 0 done, 1 invalid payload or input.
pub fn run(cmd: &BrcodeCmd) -> i32 {
    let out = match cmd {
        BrcodeCmd::Decode { payload } => {
            decode(payload).map(|d| serde_json::to_string_pretty(&d).expect("BR Code fields serialise"))
        }
        BrcodeCmd::Encode(args) => encode(args),
    };
    match out {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            match writeln!(stdout, "{text}").and_then(|_| stdout.flush()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: writing to stdout: {e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(key: Option<&str>, url: Option<&str>) -> EncodeArgs {
        EncodeArgs {
            key: key.map(Into::into),
            url: url.map(Into::into),
            amount_cents: Some(1990),
            name: "Padaria São João".into(),
            city: "Recife".into(),
            txid: Some("PEDIDO-42".into()),
            description: None,
        }
    }

    #[test]
    fn encode_then_decode_keeps_the_parts() {
        let p = encode(&args(Some("pix@example.com"), None)).unwrap();
        let d = decode(&p).unwrap();
        assert_eq!((d.kind, d.amount_cents), ("static", Some(1990)));
        assert_eq!(d.fields.key.as_deref(), Some("pix@example.com"));
        assert_eq!(d.fields.txid, "PEDIDO42");
        assert_eq!(d.fields.merchant_name, "PADARIA SAO JOAO");

        let p = encode(&args(None, Some("https://pix.example.com/qr/v2/abc"))).unwrap();
        let d = decode(&p).unwrap();
        assert_eq!(
            (d.kind, d.fields.url.as_deref(), d.fields.txid.as_str()),
            ("dynamic", Some("pix.example.com/qr/v2/abc"), "***")
        );
    }

    #[test]
    fn json_has_every_field_and_the_extras() {
        let p = encode(&args(Some("pix@example.com"), None)).unwrap();
        let v = serde_json::to_value(decode(&p).unwrap()).unwrap();
        for k in [
            "kind",
            "amount_cents",
            "point_of_initiation",
            "gui",
            "key",
            "description",
            "url",
            "mcc",
            "currency",
            "amount",
            "country",
            "merchant_name",
            "merchant_city",
            "postal_code",
            "txid",
            "crc",
        ] {
            assert!(v.get(k).is_some(), "{k} missing in {v}");
        }
        assert_eq!(v["amount"], "19.90");
        assert!(v["url"].is_null());
    }

    #[test]
    fn errors_name_type_and_tag() {
        let e = encode(&EncodeArgs { name: "🍞".into(), ..args(Some("k"), None) }).unwrap_err().to_string();
        assert!(e.contains("(InvalidValue, tag 59)"), "{e}");
        let mut p = encode(&args(Some("pix@example.com"), None)).unwrap();
        let last = if p.ends_with('0') { "1" } else { "0" };
        p.replace_range(p.len() - 1.., last);
        let e = decode(&p).unwrap_err().to_string();
        assert!(e.starts_with("CRC16 mismatch") && e.ends_with("(Crc, tag 63)"), "{e}");
    }
}
