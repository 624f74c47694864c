//! `GS k` barcodes: CODE128, EAN-13, UPC-A and EAN-8 are encoded to real bars; the other
//! symbologies are drawn as a labelled placeholder by the caller.

use super::raster::Bitmap;

/// The symbology name for `GS k m` (function A: m = 0..=6, function B: m = 65..=79).
pub fn kind_name(m: u8) -> String {
    let name = match m {
        0 | 65 => "UPC-A",
        1 | 66 => "UPC-E",
        2 | 67 => "EAN13",
        3 | 68 => "EAN8",
        4 | 69 => "CODE39",
        5 | 70 => "ITF",
        6 | 71 => "CODABAR",
        72 => "CODE93",
        73 => "CODE128",
        74 => "GS1-128",
        75 => "GS1-DATABAR-OMNI",
        76 => "GS1-DATABAR-TRUNCATED",
        77 => "GS1-DATABAR-LIMITED",
        78 => "GS1-DATABAR-EXPANDED",
        79 => "CODE128-AUTO",
        _ => return format!("TYPE{m}"),
    };
    name.to_string()
}

/// Bars (`true` = black module) and the human-readable text, or `None` when this decoder
/// draws the symbology as a placeholder. `Err` when the data is invalid for it.
pub fn encode(m: u8, data: &[u8]) -> Option<Result<(Vec<bool>, String), String>> {
    match m {
        0 | 65 => Some(upc_a(data)),
        2 | 67 => Some(ean13(data)),
        3 | 68 => Some(ean8(data)),
        73 => Some(code128(data)),
        _ => None,
    }
}

/// Draws modules `module` dots wide and `height` dots tall.
pub fn bars(modules: &[bool], module: u32, height: u32) -> Bitmap {
    let mut b = Bitmap::new(modules.len() as u32 * module, height);
    for (i, &m) in modules.iter().enumerate() {
        if m {
            b.fill_rect(i as u32 * module, 0, module, height, true);
        }
    }
    b
}

fn digits(data: &[u8]) -> Result<Vec<u8>, String> {
    data.iter()
        .map(|&b| if b.is_ascii_digit() { Ok(b - b'0') } else { Err(format!("non-digit byte 0x{b:02X}")) })
        .collect()
}

/// Modulo-10 check digit (weights 3, 1, 3 … from the rightmost data digit).
fn check_digit(d: &[u8]) -> u8 {
    let sum: u32 = d.iter().rev().enumerate().map(|(i, &x)| x as u32 * if i % 2 == 0 { 3 } else { 1 }).sum();
    ((10 - sum % 10) % 10) as u8
}

const L_CODES: [&str; 10] =
    ["0001101", "0011001", "0010011", "0111101", "0100011", "0110001", "0101111", "0111011", "0110111", "0001011"];
const PARITY: [&str; 10] =
    ["LLLLLL", "LLGLGG", "LLGGLG", "LLGGGL", "LGLLGG", "LGGLLG", "LGGGLL", "LGLGLG", "LGLGGL", "LGGLGL"];

fn push_pattern(out: &mut Vec<bool>, p: &str) {
    out.extend(p.bytes().map(|c| c == b'1'));
}

fn r_code(d: u8) -> String {
    L_CODES[d as usize].chars().map(|c| if c == '1' { '0' } else { '1' }).collect()
}

fn g_code(d: u8) -> String {
    r_code(d).chars().rev().collect()
}

fn ean13_digits(mut d: Vec<u8>) -> (Vec<bool>, String) {
    if d.len() == 12 {
        let c = check_digit(&d);
        d.push(c);
    }
    let mut out = vec![];
    push_pattern(&mut out, "101");
    let parity = PARITY[d[0] as usize].as_bytes();
    for i in 1..7 {
        if parity[i - 1] == b'L' {
            push_pattern(&mut out, L_CODES[d[i] as usize]);
        } else {
            push_pattern(&mut out, &g_code(d[i]));
        }
    }
    push_pattern(&mut out, "01010");
    for &x in &d[7..13] {
        push_pattern(&mut out, &r_code(x));
    }
    push_pattern(&mut out, "101");
    let hri = d.iter().map(|x| (b'0' + x) as char).collect();
    (out, hri)
}

fn ean13(data: &[u8]) -> Result<(Vec<bool>, String), String> {
    let d = digits(data)?;
    if d.len() != 12 && d.len() != 13 {
        return Err(format!("EAN13 needs 12 or 13 digits, got {}", d.len()));
    }
    Ok(ean13_digits(d))
}

fn upc_a(data: &[u8]) -> Result<(Vec<bool>, String), String> {
    let mut d = digits(data)?;
    if d.len() != 11 && d.len() != 12 {
        return Err(format!("UPC-A needs 11 or 12 digits, got {}", d.len()));
    }
    if d.len() == 11 {
        let c = check_digit(&d);
        d.push(c);
    }
    let mut e = vec![0];
    e.extend(d);
    let (bars, hri) = ean13_digits(e);
    Ok((bars, hri[1..].to_string()))
}

fn ean8(data: &[u8]) -> Result<(Vec<bool>, String), String> {
    let mut d = digits(data)?;
    if d.len() != 7 && d.len() != 8 {
        return Err(format!("EAN8 needs 7 or 8 digits, got {}", d.len()));
    }
    if d.len() == 7 {
        let c = check_digit(&d);
        d.push(c);
    }
    let mut out = vec![];
    push_pattern(&mut out, "101");
    for &x in &d[..4] {
        push_pattern(&mut out, L_CODES[x as usize]);
    }
    push_pattern(&mut out, "01010");
    for &x in &d[4..] {
        push_pattern(&mut out, &r_code(x));
    }
    push_pattern(&mut out, "101");
    Ok((out, d.iter().map(|x| (b'0' + x) as char).collect()))
}

/// Bar/space widths of CODE128 symbols 0..=105, then the stop pattern.
const C128: [&str; 107] = [
    "212222", "222122", "222221", "121223", "121322", "131222", "122213", "122312", "132212", "221213", "221312",
    "231212", "112232", "122132", "122231", "113222", "123122", "123221", "223211", "221132", "221231", "213212",
    "223112", "312131", "311222", "321122", "321221", "312212", "322112", "322211", "212123", "212321", "232121",
    "111323", "131123", "131321", "112313", "132113", "132311", "211313", "231113", "231311", "112133", "112331",
    "132131", "113123", "113321", "133121", "313121", "211331", "231131", "213113", "213311", "213131", "311123",
    "311321", "331121", "312113", "312311", "332111", "314111", "221411", "431111", "111224", "111422", "121124",
    "121421", "141122", "141221", "112214", "112412", "122114", "122411", "142112", "142211", "241211", "221114",
    "413111", "241112", "134111", "111242", "121142", "121241", "114212", "124112", "124211", "411212", "421112",
    "421211", "212141", "214121", "412121", "111143", "111341", "131141", "114113", "114311", "411113", "411311",
    "113141", "114131", "311141", "411131", "211412", "211214", "211232", "2331112",
];

/// Epson CODE128 data: starts with `{A`, `{B` or `{C`; `{A`/`{B`/`{C` switch sets, `{S`
/// shifts one character, `{1`..`{4` are FNC1..4, `{{` is a literal `{`. In set C each byte
/// is a value 0..=99 (not two ASCII digits).
fn code128(data: &[u8]) -> Result<(Vec<bool>, String), String> {
    let mut values: Vec<u32> = vec![];
    let mut hri = String::new();
    let mut set = 0u8; // b'A', b'B', b'C'
    let mut i = 0;
    let mut shift = false;
    while i < data.len() {
        let b = data[i];
        if b == b'{' && i + 1 < data.len() && data[i + 1] != b'{' {
            let c = data[i + 1];
            i += 2;
            match c {
                b'A' | b'B' | b'C' => {
                    if set == 0 {
                        values.push(match c {
                            b'A' => 103,
                            b'B' => 104,
                            _ => 105,
                        });
                    } else if set != c {
                        values.push(match c {
                            b'A' => 101,
                            b'B' => 100,
                            _ => 99,
                        });
                    }
                    set = c;
                }
                b'S' => {
                    values.push(98);
                    shift = true;
                }
                b'1' => values.push(102),
                b'2' => values.push(97),
                b'3' => values.push(96),
                b'4' => values.push(if set == b'A' { 101 } else { 100 }),
                _ => return Err(format!("CODE128: unknown function {{{}", c as char)),
            }
            continue;
        }
        if set == 0 {
            return Err("CODE128 data must start with {A, {B or {C".into());
        }
        let ch = if b == b'{' {
            i += 2; // `{{`
            b'{'
        } else {
            i += 1;
            b
        };
        let effective = if shift {
            shift = false;
            if set == b'A' {
                b'B'
            } else {
                b'A'
            }
        } else {
            set
        };
        match effective {
            b'C' => {
                if ch > 99 {
                    return Err(format!("CODE128 set C value {ch} > 99"));
                }
                values.push(ch as u32);
                hri.push_str(&format!("{ch:02}"));
            }
            b'A' => {
                let v = match ch {
                    32..=95 => ch as u32 - 32,
                    0..=31 => ch as u32 + 64,
                    _ => return Err(format!("CODE128 set A has no byte 0x{ch:02X}")),
                };
                values.push(v);
                if ch >= 32 {
                    hri.push(ch as char);
                }
            }
            _ => {
                if !(32..=127).contains(&ch) {
                    return Err(format!("CODE128 set B has no byte 0x{ch:02X}"));
                }
                values.push(ch as u32 - 32);
                hri.push(ch as char);
            }
        }
    }
    if values.is_empty() {
        return Err("CODE128: no data".into());
    }
    let check = values.iter().enumerate().map(|(i, &v)| if i == 0 { v } else { v * i as u32 }).sum::<u32>() % 103;
    values.push(check);
    values.push(106);
    let mut out = vec![];
    for v in values {
        let mut black = true;
        for w in C128[v as usize].bytes() {
            out.extend(std::iter::repeat_n(black, (w - b'0') as usize));
            black = !black;
        }
    }
    Ok((out, hri))
}

/// The data as a person would read it (CODE128 set markers removed), for the transcript.
pub fn readable(m: u8, data: &[u8]) -> String {
    if let Some(Ok((_, hri))) = encode(m, data) {
        return hri;
    }
    data.iter().map(|&b| if (0x20..0x7F).contains(&b) { b as char } else { '.' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code128_patterns_are_eleven_modules() {
        for (i, p) in C128.iter().enumerate() {
            let sum: u32 = p.bytes().map(|b| (b - b'0') as u32).sum();
            assert_eq!(sum, if i == 106 { 13 } else { 11 }, "symbol {i}");
        }
    }

    #[test]
    fn code128_known_checksum() {
        // "PJJ123C" in set B: the classic Wikipedia example, check symbol 54.
        let (bars, hri) = code128(b"{BPJJ123C").unwrap();
        assert_eq!(hri, "PJJ123C");
        // start + 7 data + check + stop = 10 symbols; 9*11 + 13 modules.
        assert_eq!(bars.len(), 9 * 11 + 13);
        let (_, hri) = code128(b"{C\x15\x20\x2b").unwrap();
        assert_eq!(hri, "213243");
        assert!(code128(b"ABC").is_err());
    }

    #[test]
    fn ean13_check_digit_and_width() {
        let (bars, hri) = ean13(b"400638133393").unwrap();
        assert_eq!(hri, "4006381333931");
        assert_eq!(bars.len(), 95);
        let (bars, hri) = upc_a(b"03600029145").unwrap();
        assert_eq!(hri, "036000291452");
        assert_eq!(bars.len(), 95);
        assert_eq!(ean8(b"9638507").unwrap().1, "96385074");
    }
}
