//! The languages pixgate speaks on screens and receipts, and every fixed label in them.
//!
//! Devices carry a BCP 47 tag (`"pt-BR"`, `"en-US"`, `"es-ES"`) in the device registry
//! (`fixtures/cdc/README.md`, Device document). Labels are plain Unicode; receipts pass
//! them through [`crate::codepage::CodePage::encode_lossy`] like any other text.

use chrono::{DateTime, TimeZone};
use serde::{Deserialize, Serialize};

/// A display language. Currency is always BRL whatever the language (see [`crate::money`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Locale {
    /// Brazilian Portuguese, `pt-BR` (the default).
    #[default]
    PtBr,
    /// US English, `en-US`.
    EnUs,
    /// Spanish (Spain), `es-ES`.
    EsEs,
}

/// A fixed text shown or printed by pixgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Label {
    /// "Total" (amount line).
    Total,
    /// "Paid" (receipt title / status).
    Paid,
    /// "Payer".
    Payer,
    /// "Date" (paid-at line).
    Date,
    /// "End-to-end ID" (the Pix transaction's E2E id).
    EndToEndId,
    /// "Pay with Pix" (QR screen title).
    PayWithPix,
    /// "Payment confirmed" (paid screen).
    PaymentConfirmed,
    /// "Charge expired" (expired screen).
    ChargeExpired,
    /// "Scan the QR code with your bank's app" (QR screen hint).
    ScanHint,
    /// "Expires at" (QR screen, followed by a time).
    ExpiresAt,
    /// "Pix receipt" (receipt title).
    PixReceipt,
    /// "Charge" (charge id line).
    Charge,
    /// "Transaction ID" (txid line).
    Txid,
    /// "Comment".
    Comment,
    /// "Items".
    Items,
    /// "Ask the cashier for a new charge" (expired screen hint).
    NewChargeHint,
    /// "Thank you!".
    ThankYou,
    /// "Valid until" (pay-with-Pix slip, followed by a date and time).
    ValidUntil,
    /// "Expired at" (expiry notice, followed by a date and time).
    ExpiredAt,
    /// "Not paid" (expiry notice).
    NotPaid,
}

impl Locale {
    /// Parses a BCP 47 tag, case-insensitively, `_` accepted for `-`: `"pt-BR"`, `"pt"` →
    /// `PtBr`; `"en-US"`, `"en"`, `"en-GB"` → `EnUs`; `"es-ES"`, `"es"`, `"es-AR"` → `EsEs`.
    /// Anything else (including empty) → `PtBr`, the Brazilian default.
    pub fn from_tag(tag: &str) -> Locale {
        let t = tag.trim().to_ascii_lowercase().replace('_', "-");
        match t.split('-').next().unwrap_or("") {
            "en" => Locale::EnUs,
            "es" => Locale::EsEs,
            _ => Locale::PtBr,
        }
    }

    /// The canonical BCP 47 tag: `"pt-BR"`, `"en-US"` or `"es-ES"`.
    pub fn tag(self) -> &'static str {
        match self {
            Locale::PtBr => "pt-BR",
            Locale::EnUs => "en-US",
            Locale::EsEs => "es-ES",
        }
    }

    /// The text of `label` in this language.
    pub fn label(self, label: Label) -> &'static str {
        use Label::*;
        use Locale::*;
        match (label, self) {
            (Total, PtBr) => "Total",
            (Total, EnUs) => "Total",
            (Total, EsEs) => "Total",
            (Paid, PtBr) => "Pago",
            (Paid, EnUs) => "Paid",
            (Paid, EsEs) => "Pagado",
            (Payer, PtBr) => "Pagador",
            (Payer, EnUs) => "Payer",
            (Payer, EsEs) => "Pagador",
            (Date, PtBr) => "Data",
            (Date, EnUs) => "Date",
            (Date, EsEs) => "Fecha",
            (EndToEndId, PtBr) => "ID fim a fim",
            (EndToEndId, EnUs) => "End-to-end ID",
            (EndToEndId, EsEs) => "ID de extremo a extremo",
            (PayWithPix, PtBr) => "Pague com Pix",
            (PayWithPix, EnUs) => "Pay with Pix",
            (PayWithPix, EsEs) => "Paga con Pix",
            (PaymentConfirmed, PtBr) => "Pagamento confirmado",
            (PaymentConfirmed, EnUs) => "Payment confirmed",
            (PaymentConfirmed, EsEs) => "Pago confirmado",
            (ChargeExpired, PtBr) => "Cobrança expirada",
            (ChargeExpired, EnUs) => "Charge expired",
            (ChargeExpired, EsEs) => "Cobro expirado",
            (ScanHint, PtBr) => "Escaneie o QR code no app do seu banco",
            (ScanHint, EnUs) => "Scan the QR code with your bank's app",
            (ScanHint, EsEs) => "Escanea el código QR con la app de tu banco",
            (ExpiresAt, PtBr) => "Expira às",
            (ExpiresAt, EnUs) => "Expires at",
            (ExpiresAt, EsEs) => "Caduca a las",
            (PixReceipt, PtBr) => "Comprovante Pix",
            (PixReceipt, EnUs) => "Pix receipt",
            (PixReceipt, EsEs) => "Comprobante Pix",
            (Charge, PtBr) => "Cobrança",
            (Charge, EnUs) => "Charge",
            (Charge, EsEs) => "Cobro",
            (Txid, PtBr) => "ID da transação",
            (Txid, EnUs) => "Transaction ID",
            (Txid, EsEs) => "ID de transacción",
            (Comment, PtBr) => "Observação",
            (Comment, EnUs) => "Comment",
            (Comment, EsEs) => "Comentario",
            (Items, PtBr) => "Itens",
            (Items, EnUs) => "Items",
            (Items, EsEs) => "Artículos",
            (NewChargeHint, PtBr) => "Peça uma nova cobrança ao caixa",
            (NewChargeHint, EnUs) => "Ask the cashier for a new charge",
            (NewChargeHint, EsEs) => "Pide un nuevo cobro en caja",
            (ThankYou, PtBr) => "Obrigado!",
            (ThankYou, EnUs) => "Thank you!",
            (ThankYou, EsEs) => "¡Gracias!",
            (ValidUntil, PtBr) => "Válido até",
            (ValidUntil, EnUs) => "Valid until",
            (ValidUntil, EsEs) => "Válido hasta",
            (ExpiredAt, PtBr) => "Expirou em",
            (ExpiredAt, EnUs) => "Expired at",
            (ExpiredAt, EsEs) => "Caducó el",
            (NotPaid, PtBr) => "Não paga",
            (NotPaid, EnUs) => "Not paid",
            (NotPaid, EsEs) => "No pagado",
        }
    }

    /// Date and time in this language's usual numeric form, 24-hour except en-US:
    /// pt-BR and es-ES `dd/mm/yyyy HH:MM`, en-US `mm/dd/yyyy hh:MM AM` (chrono's
    /// `%d/%m/%Y %H:%M` and `%m/%d/%Y %I:%M %p`).
    pub fn format_datetime<Tz: TimeZone>(self, t: &DateTime<Tz>) -> String
    where
        Tz::Offset: std::fmt::Display,
    {
        let mut out = String::with_capacity(20);
        self.push_datetime(t, &mut out);
        out
    }

    /// [`Locale::format_datetime`] appended to `out`, the digits written directly for
    /// years 0..=9999 (chrono's formatter for the others, which carry a sign).
    pub fn push_datetime<Tz: TimeZone>(self, t: &DateTime<Tz>, out: &mut String)
    where
        Tz::Offset: std::fmt::Display,
    {
        use chrono::{Datelike, Timelike};
        use std::fmt::Write;
        let year = t.year();
        if !(0..=9999).contains(&year) {
            let spec = match self {
                Locale::PtBr | Locale::EsEs => "%d/%m/%Y %H:%M",
                Locale::EnUs => "%m/%d/%Y %I:%M %p",
            };
            // Writing into a String cannot fail.
            let _ = write!(out, "{}", t.format(spec));
            return;
        }
        let two = |out: &mut String, n: u32| {
            out.push(char::from(b'0' + (n / 10 % 10) as u8));
            out.push(char::from(b'0' + (n % 10) as u8));
        };
        let (first, second) = match self {
            Locale::PtBr | Locale::EsEs => (t.day(), t.month()),
            Locale::EnUs => (t.month(), t.day()),
        };
        two(out, first);
        out.push('/');
        two(out, second);
        out.push('/');
        two(out, year as u32 / 100);
        two(out, year as u32 % 100);
        out.push(' ');
        match self {
            Locale::PtBr | Locale::EsEs => two(out, t.hour()),
            Locale::EnUs => two(out, t.hour12().1),
        }
        out.push(':');
        two(out, t.minute());
        if self == Locale::EnUs {
            out.push_str(if t.hour12().0 { " PM" } else { " AM" });
        }
    }

    /// Time of day: `HH:MM` (pt-BR, es-ES) or `hh:MM AM` (en-US).
    pub fn format_time<Tz: TimeZone>(self, t: &DateTime<Tz>) -> String
    where
        Tz::Offset: std::fmt::Display,
    {
        match self {
            Locale::PtBr | Locale::EsEs => t.format("%H:%M").to_string(),
            Locale::EnUs => t.format("%I:%M %p").to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, Utc};

    #[test]
    fn tags() {
        assert_eq!(Locale::from_tag("pt-BR"), Locale::PtBr);
        assert_eq!(Locale::from_tag("EN_us"), Locale::EnUs);
        assert_eq!(Locale::from_tag("es-ES"), Locale::EsEs);
        assert_eq!(Locale::from_tag("fr-FR"), Locale::PtBr);
        assert_eq!(Locale::from_tag(""), Locale::PtBr);
        for l in [Locale::PtBr, Locale::EnUs, Locale::EsEs] {
            assert_eq!(Locale::from_tag(l.tag()), l);
        }
    }

    #[test]
    fn labels_and_dates() {
        assert_eq!(Locale::PtBr.label(Label::PaymentConfirmed), "Pagamento confirmado");
        assert_eq!(Locale::EsEs.label(Label::ChargeExpired), "Cobro expirado");
        assert_eq!(Locale::PtBr.label(Label::ValidUntil), "Válido até");
        assert_eq!(Locale::EnUs.label(Label::ExpiredAt), "Expired at");
        assert_eq!(Locale::EsEs.label(Label::NotPaid), "No pagado");
        let t = chrono::DateTime::parse_from_rfc3339("2026-11-27T12:01:07.340Z").unwrap().with_timezone(&Utc);
        let sp = t.with_timezone(&chrono_tz::America::Sao_Paulo);
        assert_eq!(Locale::PtBr.format_datetime(&sp), "27/11/2026 09:01");
        assert_eq!(Locale::EnUs.format_datetime(&sp), "11/27/2026 09:01 AM");
    }

    /// The direct writer gives chrono's `%d/%m/%Y %H:%M` / `%m/%d/%Y %I:%M %p` for instants
    /// spread over years 0 to 10,100 (every hour of the day, midnight and noon included) in
    /// several time zones, and years outside 0..=9999 still go through chrono.
    #[test]
    fn datetime_matches_chrono_format() {
        let zones =
            [chrono_tz::America::Sao_Paulo, chrono_tz::UTC, chrono_tz::Asia::Tokyo, chrono_tz::America::New_York];
        let first =
            chrono::NaiveDate::from_ymd_opt(-2, 12, 31).unwrap().and_hms_opt(23, 59, 0).unwrap().and_utc().timestamp();
        let mut secs = first;
        let mut n = 0;
        while n < 60_000 {
            let t = chrono::DateTime::from_timestamp(secs, 0).unwrap();
            for tz in zones {
                let local = t.with_timezone(&tz);
                assert_eq!(Locale::PtBr.format_datetime(&local), local.format("%d/%m/%Y %H:%M").to_string());
                assert_eq!(Locale::EsEs.format_datetime(&local), local.format("%d/%m/%Y %H:%M").to_string());
                assert_eq!(Locale::EnUs.format_datetime(&local), local.format("%m/%d/%Y %I:%M %p").to_string());
            }
            // About 63 days a step, shifted by 7 minutes and 0..96 hours: every hour of the
            // day and many minutes, years -2 to past 10,000.
            secs += 5_300_420 + (n % 97) * 3_600;
            n += 1;
        }
        assert!(chrono::DateTime::from_timestamp(secs, 0).unwrap().year() > 10_000, "the walk reaches past year 9999");
    }
}
