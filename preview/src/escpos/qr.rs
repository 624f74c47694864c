//! `GS ( k` QR symbols (cn = 49): model, module size, error correction, store, print.

use super::raster::Bitmap;
use super::state::QrSettings;
use qrcode::{Color, EcLevel, QrCode};

/// Quiet zone drawn around a printed symbol, in modules. An Epson printer leaves the
/// quiet zone to the paper margin; here the image edge is the paper edge, so the decoder
/// draws it, which keeps a left-justified symbol scannable.
pub const QUIET_MODULES: u32 = 4;

/// What a `GS ( k` QR function did.
#[derive(Debug, PartialEq, Eq)]
pub enum QrAction {
    /// A setting changed or data was stored.
    Set,
    /// fn 181: print the stored symbol.
    Print,
    /// fn 182: transmit size information (a transport may answer; nothing is printed).
    SizeInfo,
    /// A function this decoder does not know.
    Unknown(u8),
}

/// Applies QR function `func` with its `params` (after cn and fn).
pub fn apply(qr: &mut QrSettings, func: u8, params: &[u8], warn: &mut impl FnMut(String)) -> QrAction {
    match func {
        // fn 165: select model: n1 n2
        65 => {
            match params.first() {
                Some(49) => qr.model = 1,
                Some(50) => qr.model = 2,
                Some(51) => qr.model = 3,
                other => warn(format!("GS ( k QR model: invalid n1 {other:?}")),
            }
            QrAction::Set
        }
        // fn 167: module size
        67 => {
            match params.first() {
                Some(&n) if (1..=16).contains(&n) => qr.module = n as u32,
                other => warn(format!("GS ( k QR module size: invalid n {other:?}, kept {}", qr.module)),
            }
            QrAction::Set
        }
        // fn 169: error correction
        69 => {
            match params.first() {
                Some(48) => qr.ec = 'L',
                Some(49) => qr.ec = 'M',
                Some(50) => qr.ec = 'Q',
                Some(51) => qr.ec = 'H',
                other => warn(format!("GS ( k QR error correction: invalid n {other:?}")),
            }
            QrAction::Set
        }
        // fn 180: store data: m (48) then the data
        80 => {
            let data = params.get(1..).unwrap_or(&[]);
            qr.data = Some(data.to_vec());
            QrAction::Set
        }
        81 => QrAction::Print,
        82 => QrAction::SizeInfo,
        other => QrAction::Unknown(other),
    }
}

/// The symbol for the stored data, with quiet zone, at the module size in force and no
/// wider than `max_width` (the quiet zone shrinks first). `Err` when the data does not
/// fit in any QR version.
pub fn render(qr: &QrSettings, data: &[u8], max_width: u32) -> Result<Bitmap, String> {
    let ec = match qr.ec {
        'M' => EcLevel::M,
        'Q' => EcLevel::Q,
        'H' => EcLevel::H,
        _ => EcLevel::L,
    };
    let code = QrCode::with_error_correction_level(data, ec).map_err(|e| format!("QR data does not encode: {e:?}"))?;
    let n = code.width() as u32;
    let m = qr.module;
    let mut quiet = QUIET_MODULES;
    while quiet > 0 && (n + 2 * quiet) * m > max_width {
        quiet -= 1;
    }
    let side = (n + 2 * quiet) * m;
    let mut b = Bitmap::new(side, side);
    let colors = code.to_colors();
    for (i, c) in colors.iter().enumerate() {
        if *c == Color::Dark {
            let (x, y) = ((i as u32 % n + quiet) * m, (i as u32 / n + quiet) * m);
            b.fill_rect(x, y, m, m, true);
        }
    }
    Ok(b)
}

/// Finds and decodes every QR symbol in a printed page (pads it with white first, so a
/// symbol at the paper edge is still found). Used by tests and by callers checking output.
pub fn scan(img: &image::GrayImage) -> Vec<String> {
    let pad = 40usize;
    let (w, h) = (img.width() as usize, img.height() as usize);
    let mut prepared = rqrr::PreparedImage::prepare_from_greyscale(w + 2 * pad, h + 2 * pad, |x, y| {
        if x < pad || y < pad || x >= w + pad || y >= h + pad {
            255
        } else {
            img.get_pixel((x - pad) as u32, (y - pad) as u32).0[0]
        }
    });
    let mut found = vec![];
    for g in prepared.detect_grids() {
        let top = g.bounds.iter().map(|p| p.y).min().unwrap_or(0);
        if let Ok((_, content)) = g.decode() {
            found.push((top, content));
        }
    }
    // Top to bottom, as printed.
    found.sort_by_key(|(top, _)| *top);
    found.into_iter().map(|(_, c)| c).collect()
}
