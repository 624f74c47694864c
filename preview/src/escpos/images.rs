//! Image data of `GS v 0` (raster), `GS ( L` fn 112 (graphics) and `ESC *` (column bit
//! image), decoded into bitmaps as printed. Every bitmap is clipped to the paper width and
//! to the rows whose data is really present, so a lying header cannot make a huge allocation.

use super::raster::Bitmap;

/// Decodes row-format data `row_bytes` per row, at most `rows` rows, at most `clip` dots
/// wide before scaling by `sx` × `sy`. Returns the bitmap and how many rows had data.
fn rows_image(width: u32, rows: u32, row_bytes: usize, data: &[u8], sx: u32, sy: u32, clip: u32) -> (Bitmap, u32) {
    let present = if row_bytes == 0 { 0 } else { data.len().div_ceil(row_bytes) } as u32;
    let h = rows.min(present);
    let w = width.min(clip.div_ceil(sx));
    let b = Bitmap::from_rows(w, h, row_bytes, data);
    (b.scaled(sx, sy), h)
}

/// `GS v 0 m xL xH yL yH d…`: `x_bytes` bytes per row, MSB first. m bit 0 doubles the
/// width, bit 1 the height (m = 0..=3 or '0'..='3').
/// Also returns the printed size before clipping to the paper, for the transcript marker.
pub fn raster(
    mode: u8,
    x_bytes: u16,
    height: u16,
    data: &[u8],
    page_width: u32,
) -> (Bitmap, (u32, u32), Option<String>) {
    let m = if mode >= 48 { mode - 48 } else { mode };
    let sx = if m & 1 != 0 { 2 } else { 1 };
    let sy = if m & 2 != 0 { 2 } else { 1 };
    let width = x_bytes as u32 * 8;
    let (b, rows) = rows_image(width, height as u32, x_bytes as usize, data, sx, sy, page_width);
    let mut warn = None;
    if rows < height as u32 {
        warn = Some(format!("image data ends after {rows} of {height} rows"));
    } else if width * sx > page_width {
        warn = Some(format!("image is {} dots wide, wider than the {page_width}-dot paper: clipped", width * sx));
    }
    if m > 3 {
        warn = Some(format!("unknown mode {mode}, printed as mode {}", m & 3));
    }
    (b, (width * sx, rows * sy), warn)
}

/// A decoded image (scaled, clipped to the paper), its printed size in dots (width,
/// height) before clipping, and a warning if any.
pub type Decoded = (Bitmap, (u32, u32), Option<String>);

/// `GS ( L` / `GS 8 L` fn 112 (store graphics data in the print buffer), from the
/// parameters after m and fn: `a bx by c xL xH yL yH d…`. `a` is the tone (only 48,
/// monochrome, is supported), `bx` / `by` the horizontal / vertical scale (2 doubles,
/// anything else is 1), `c` the colour (ignored: one colour), `x` × `y` the size in dots,
/// and `d…` rows of ⌈x / 8⌉ bytes, MSB first. `page_width` is the paper width in dots.
///
/// # Errors
/// A message when the header is shorter than 8 bytes or the tone is not monochrome; data
/// shorter or longer than the header says is printed as far as present, with a warning.
pub fn graphics_store(params: &[u8], page_width: u32) -> Result<Decoded, String> {
    if params.len() < 8 {
        return Err(format!("header is {} bytes, needs 8", params.len()));
    }
    let (a, bx, by, _c) = (params[0], params[1], params[2], params[3]);
    if a != 48 {
        return Err(format!("tone a={a} is not monochrome (48): not supported"));
    }
    let sx = if bx == 2 { 2 } else { 1 };
    let sy = if by == 2 { 2 } else { 1 };
    let width = u16::from_le_bytes([params[4], params[5]]) as u32;
    let height = u16::from_le_bytes([params[6], params[7]]) as u32;
    let row_bytes = width.div_ceil(8) as usize;
    let data = &params[8..];
    let expected = row_bytes * height as usize;
    let (b, rows) = rows_image(width, height, row_bytes, data, sx, sy, page_width);
    let warn = if data.len() < expected {
        Some(format!(
            "length field covers {} data bytes but a {width}x{height} image needs {expected}: printed what is there",
            data.len()
        ))
    } else if data.len() > expected {
        Some(format!("{} bytes after the {width}x{height} image data ignored", data.len() - expected))
    } else if width * sx > page_width {
        Some(format!("image is {} dots wide, wider than the {page_width}-dot paper: clipped", width * sx))
    } else {
        None
    };
    Ok((b, (width * sx, rows * sy), warn))
}

/// `ESC * m nL nH d…`: columns of 8 (m = 0, 1) or 24 (m = 32, 33) dots, MSB at the top.
/// Single density (m = 0, 32) doubles each column; 8-dot modes are three dots per bit
/// vertically (the 8-dot modes print at a third of the vertical resolution).
pub fn bit_image(mode: u8, columns: u16, data: &[u8], page_width: u32) -> (Bitmap, Option<String>) {
    let (dots, sx, sy) = match mode {
        0 => (8u32, 2u32, 3u32),
        1 => (8, 1, 3),
        32 => (24, 2, 1),
        33 => (24, 1, 1),
        _ => return (Bitmap::new(0, 0), Some(format!("unknown mode {mode}: not printed"))),
    };
    let per_col = (dots / 8) as usize;
    let present = (data.len() / per_col) as u32;
    let cols = (columns as u32).min(present).min(page_width.div_ceil(sx));
    let mut b = Bitmap::new(cols, dots);
    for x in 0..cols {
        for k in 0..per_col {
            let byte = data[x as usize * per_col + k];
            for bit in 0..8 {
                if byte & (0x80 >> bit) != 0 {
                    b.set(x, (k * 8 + bit) as u32, true);
                }
            }
        }
    }
    let warn = if present < columns as u32 {
        Some(format!("data ends after {present} of {columns} columns"))
    } else if columns as u32 * sx > page_width {
        Some("image wider than the paper: clipped".to_string())
    } else {
        None
    };
    (b.scaled(sx, sy), warn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raster_modes_scale() {
        let data = [0xFFu8, 0x00];
        assert_eq!(raster(0, 1, 2, &data, 384).0.height, 2);
        let (b, size, _) = raster(51, 1, 2, &data, 384);
        assert_eq!(size, (16, 4));
        assert_eq!((b.width, b.height), (16, 4));
        assert!(b.get(15, 1) && !b.get(0, 2));
    }

    #[test]
    fn lying_graphics_header_is_bounded() {
        let mut p = vec![48, 1, 1, 49, 0xFF, 0xFF, 0xFF, 0xFF];
        p.extend([0xAA; 10]);
        let (b, _, w) = graphics_store(&p, 384).unwrap();
        assert!(b.width <= 384 && b.height <= 1);
        assert!(w.unwrap().contains("needs"));
    }

    #[test]
    fn bit_image_24_dot() {
        let data = [0x80, 0, 1, 0xFF, 0xFF, 0xFF];
        let (b, w) = bit_image(33, 2, &data, 384);
        assert!(w.is_none());
        assert_eq!((b.width, b.height), (2, 24));
        assert!(b.get(0, 0) && b.get(0, 23) && !b.get(0, 1) && b.get(1, 12));
    }
}
