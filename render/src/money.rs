//! Amounts of money as people read them. Amounts are integer **centavos** everywhere in
//! pixgate (the charge's `value`); the currency is always the Brazilian real (BRL), only
//! the number format follows the display language:
//!
//! | Locale | 123456 centavos | Rule |
//! |---|---|---|
//! | pt-BR | `R$ 1.234,56` | symbol, space, `.` thousands, `,` decimals (CLDR pt) |
//! | en-US | `R$1,234.56` | symbol glued, `,` thousands, `.` decimals (CLDR en, BRL) |
//! | es-ES | `1.234,56 R$` | symbol after, `.` thousands, `,` decimals (CLDR es's "no grouping below 10 000" is not applied: one rule for every amount) |
//!
//! Negative amounts (refunds) put `-` before everything: `-R$ 1,00`. Spaces are plain
//! ASCII spaces so that printers and fonts need nothing special.

use crate::locale::Locale;

/// Formats `cents` centavos as BRL in `locale`'s style (table in the module docs).
/// Always two decimals; thousands grouped in threes. Example: `format_amount(990,
/// Locale::PtBr)` → `"R$ 9,90"`.
pub fn format_amount(cents: i64, locale: Locale) -> String {
    let neg = cents < 0;
    let abs = cents.unsigned_abs();
    let (thousands, decimal) = match locale {
        Locale::PtBr | Locale::EsEs => ('.', ','),
        Locale::EnUs => (',', '.'),
    };
    let number = format!("{}{decimal}{:02}", group(abs / 100, thousands), abs % 100);
    let sign = if neg { "-" } else { "" };
    match locale {
        Locale::PtBr => format!("{sign}R$ {number}"),
        Locale::EnUs => format!("{sign}R${number}"),
        Locale::EsEs => format!("{sign}{number} R$"),
    }
}

fn group(n: u64, sep: char) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(sep);
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(format_amount(123456, Locale::PtBr), "R$ 1.234,56");
        assert_eq!(format_amount(123456, Locale::EnUs), "R$1,234.56");
        assert_eq!(format_amount(123456, Locale::EsEs), "1.234,56 R$");
        assert_eq!(format_amount(990, Locale::PtBr), "R$ 9,90");
        assert_eq!(format_amount(5, Locale::PtBr), "R$ 0,05");
        assert_eq!(format_amount(0, Locale::EnUs), "R$0.00");
        assert_eq!(format_amount(1_234_567, Locale::PtBr), "R$ 12.345,67");
        assert_eq!(format_amount(100_000_000, Locale::PtBr), "R$ 1.000.000,00");
        assert_eq!(format_amount(-100, Locale::PtBr), "-R$ 1,00");
        assert_eq!(format_amount(i64::MIN, Locale::EnUs), "-R$92,233,720,368,547,758.08");
    }
}
