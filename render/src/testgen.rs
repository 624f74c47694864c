//! Test-only: a small deterministic generator of inputs (xorshift64*) for the generated
//! tests of the BR Code writers and the receipt layout. No dependency, the same cases on
//! every run, and a failure names its case number.

/// The generator's state; seed with any non-zero number.
pub struct Gen(pub u64);

impl Gen {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `items`.
    pub fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Text of up to `max` characters drawn from what charges really carry and what breaks
    /// naive writers: ASCII, the BR Code specials, Portuguese and Spanish letters,
    /// typographic punctuation, controls, NBSP, emoji (4-byte UTF-8), CJK, combining marks,
    /// `ß` (no fallback, and "SS" in upper case), runs of spaces, short and long words (a
    /// 32-character end-to-end id is longer than a 58 mm line in font A).
    pub fn text(&mut self, max: u64) -> String {
        const POOL: &[&str] = &[
            "a",
            "Z",
            "q",
            "0",
            "7",
            " ",
            " ",
            "  ",
            "&",
            "@",
            ".",
            "-",
            "_",
            "+",
            "/",
            ":",
            "*",
            "$",
            "%",
            "#",
            "'",
            "ã",
            "ç",
            "É",
            "í",
            "Õ",
            "ñ",
            "Ñ",
            "ü",
            "ß",
            "“",
            "”",
            "—",
            "…",
            "€",
            "£",
            "¡",
            "¿",
            "º",
            "ª",
            "\u{A0}",
            "\n",
            "\t",
            "\u{7F}",
            "\u{1B}",
            "🍞",
            "🙂",
            "\u{FE0F}",
            "漢",
            "\u{301}",
            "Ω",
            "padaria",
            "São Paulo",
            "PIX",
            "Tapioca ",
            " condensado",
            "E25328704202611271201yxv2kgafrfw",
            "Açúcar",
        ];
        let n = self.below(max + 1);
        let mut s = String::new();
        while (s.chars().count() as u64) < n {
            s.push_str(POOL[self.below(POOL.len() as u64) as usize]);
        }
        s.chars().take(n as usize).collect()
    }
}
