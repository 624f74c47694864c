//! The picture in `simulators/README.md`: the decoder's print of
//! `fixtures/escpos/escpos-tools/receipt-with-logo.bin` beside a photo of the same
//! file printed on a real printer (`receipt-with-logo-photo.png`, from escpos-tools).
//!
//! Without `UPDATE_DOCS=1` this only checks that the decode still has the text the README
//! talks about; with it, it rewrites `simulators/docs/receipt-with-logo-side-by-side.png`:
//!
//! ```sh
//! UPDATE_DOCS=1 cargo test -p simulators --test readme_side_by_side
//! ```

use image::imageops::{overlay, resize, FilterType};
use image::{GrayImage, Luma};
use preview::escpos::{decode, DecodeOptions};
use render::font::{draw_mono, Face};
use std::path::Path;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/escpos/escpos-tools");
const OUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/receipt-with-logo-side-by-side.png");

#[test]
fn receipt_with_logo_beside_its_photo() {
    let dir = Path::new(DIR);
    let bytes =
        std::fs::read(dir.join("receipt-with-logo.bin")).unwrap_or_else(|e| panic!("{DIR}/receipt-with-logo.bin: {e}"));
    let d = decode(&bytes, &DecodeOptions::mm80());
    for want in [
        "[GRAPHICS 300x236]",
        "ExampleMart Ltd.",
        "SALES INVOICE",
        "Subtotal",
        "$ 14.25",
        "[CUT full]",
        "[DRAWER pin2]",
    ] {
        assert!(d.transcript.contains(want), "decode lacks {want:?}:\n{}", d.transcript);
    }
    if std::env::var("UPDATE_DOCS").as_deref() != Ok("1") {
        return;
    }

    // Photo scaled (bilinear) to the decode's height, so both show the receipt at about the
    // same size: the photo is 302 × 412 px for a 80 mm roll, the decode 576 dots wide.
    let photo = image::open(dir.join("receipt-with-logo-photo.png")).unwrap().to_luma8();
    let h = d.image.height();
    let w = (photo.width() as f64 * h as f64 / photo.height() as f64).round() as u32;
    let photo = resize(&photo, w, h, FilterType::Triangle);

    let (gap, caption, border) = (24u32, 40u32, 1u32);
    let width = d.image.width() + 2 * border + gap + w;
    let mut out = GrayImage::from_pixel(width, h + caption + 2 * border, Luma([255]));
    draw_mono(&mut out, Face::MonoBold, 20.0, 0.0, 8.0, "printer-sim decode (576 dots)");
    draw_mono(
        &mut out,
        Face::MonoBold,
        20.0,
        (d.image.width() + 2 * border + gap) as f32,
        8.0,
        "photo of a real print",
    );
    // A thin frame shows where the decoded paper ends (its background is white too).
    for x in 0..d.image.width() + 2 * border {
        out.put_pixel(x, caption, Luma([160]));
        out.put_pixel(x, caption + h + border, Luma([160]));
    }
    for y in caption..caption + h + 2 * border {
        out.put_pixel(0, y, Luma([160]));
        out.put_pixel(d.image.width() + border, y, Luma([160]));
    }
    overlay(&mut out, &d.image, border as i64, (caption + border) as i64);
    overlay(&mut out, &photo, (d.image.width() + 2 * border + gap) as i64, (caption + border) as i64);
    std::fs::create_dir_all(Path::new(OUT).parent().unwrap()).unwrap();
    out.save(OUT).unwrap();
}
