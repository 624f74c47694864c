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
    let mut out = String::with_capacity(32);
    push_amount(cents, locale, &mut out);
    out
}

/// [`format_amount`] appended to `out` (no allocation when `out` has room; the text is
/// ASCII, at most 32 bytes).
pub fn push_amount(cents: i64, locale: Locale, out: &mut String) {
    let abs = cents.unsigned_abs();
    let (thousands, decimal) = match locale {
        Locale::PtBr | Locale::EsEs => ('.', ','),
        Locale::EnUs => (',', '.'),
    };
    if cents < 0 {
        out.push('-');
    }
    match locale {
        Locale::PtBr => out.push_str("R$ "),
        Locale::EnUs => out.push_str("R$"),
        Locale::EsEs => {}
    }
    // The whole reais, digits grouped in threes from the right.
    let mut digits = [0u8; 20];
    let mut n = abs / 100;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in (0..len).rev() {
        out.push(char::from(digits[i]));
        if i > 0 && i % 3 == 0 {
            out.push(thousands);
        }
    }
    out.push(decimal);
    out.push(char::from(b'0' + (abs % 100 / 10) as u8));
    out.push(char::from(b'0' + (abs % 10) as u8));
    if locale == Locale::EsEs {
        out.push_str(" R$");
    }
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
        assert_eq!(format_amount(i64::MAX, Locale::EsEs), "92.233.720.368.547.758,07 R$");
        assert_eq!(format_amount(-5, Locale::EsEs), "-0,05 R$");
        assert_eq!(format_amount(100_000, Locale::EnUs), "R$1,000.00");
        assert_eq!(format_amount(99_999, Locale::PtBr), "R$ 999,99");
    }

    /// The grouping, checked against a grouping written the obvious way (every third digit
    /// from the right) for amounts of every length.
    #[test]
    fn grouping_matches_the_obvious_rule() {
        let mut n: i64 = 7;
        while n < i64::MAX / 11 {
            for cents in [n, -n, n + 1] {
                let reais = cents.unsigned_abs() / 100;
                let digits = reais.to_string();
                let mut grouped = String::new();
                for (i, c) in digits.chars().enumerate() {
                    if i > 0 && (digits.len() - i) % 3 == 0 {
                        grouped.push('.');
                    }
                    grouped.push(c);
                }
                let sign = if cents < 0 { "-" } else { "" };
                assert_eq!(
                    format_amount(cents, Locale::PtBr),
                    format!("{sign}R$ {grouped},{:02}", cents.unsigned_abs() % 100)
                );
            }
            n = n * 11 + 3;
        }
    }
}
