//! JSON text as tinker writes its `sample` request body: pydantic's
//! `model_dump(mode="json")` handed to `json.dumps(ensure_ascii=False,
//! separators=(",", ":"), allow_nan=False)`. So: no spaces, non-ASCII text
//! as UTF-8, floats as Python's `repr`, bytes fields as standard base64.
//! `rust/py/sample.rs` reads the request and writes it with this.

/// A JSON text being written. Every value is followed by a `,`; closing an
/// object or array takes the last one back, so callers never track "first".
pub struct Json {
    out: Vec<u8>,
}

impl Json {
    pub fn with_capacity(n: usize) -> Self {
        Json {
            out: Vec::with_capacity(n),
        }
    }

    pub fn into_bytes(mut self) -> Vec<u8> {
        if self.out.last() == Some(&b',') {
            self.out.pop();
        }
        self.out
    }

    pub fn begin_object(&mut self) {
        self.out.push(b'{');
    }

    pub fn end_object(&mut self) {
        self.close(b'}');
    }

    pub fn begin_array(&mut self) {
        self.out.push(b'[');
    }

    pub fn end_array(&mut self) {
        self.close(b']');
    }

    fn close(&mut self, bracket: u8) {
        match self.out.last_mut() {
            Some(last) if *last == b',' => *last = bracket,
            _ => self.out.push(bracket),
        }
        self.out.push(b',');
    }

    /// `"name":`; field names are plain ASCII identifiers, written as they are.
    pub fn key(&mut self, name: &str) {
        debug_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    pub fn int(&mut self, v: i64) {
        write_int(&mut self.out, v);
        self.out.push(b',');
    }

    pub fn ints<T: Copy + Into<i64>>(&mut self, values: &[T]) {
        self.out.reserve(values.len() * 7 + 2);
        self.out.push(b'[');
        for &v in values {
            write_int(&mut self.out, v.into());
            self.out.push(b',');
        }
        self.end_array();
    }

    /// A float as Python's `repr` writes it; `false`, writing nothing, for
    /// NaN and infinities (which `allow_nan=False` refuses).
    #[must_use]
    pub fn float(&mut self, v: f64) -> bool {
        if !v.is_finite() {
            return false;
        }
        write_float_repr(&mut self.out, v);
        self.out.push(b',');
        true
    }

    pub fn bool(&mut self, v: bool) {
        self.out.extend_from_slice(if v { b"true," } else { b"false," });
    }

    pub fn string(&mut self, s: &str) {
        write_string(&mut self.out, s);
        self.out.push(b',');
    }

    /// Bytes as the base64 text of a JSON string.
    pub fn base64(&mut self, data: &[u8]) {
        self.out.push(b'"');
        write_base64(&mut self.out, data);
        self.out.extend_from_slice(b"\",");
    }
}

const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// `str(v)` of an int.
pub fn write_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut pos = buf.len();
    let mut n = v.unsigned_abs();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        pos -= 2;
        buf[pos..pos + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        pos -= 2;
        buf[pos..pos + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        pos -= 1;
        buf[pos] = b'0' + n as u8;
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[pos..]);
}

/// `repr(v)` of a finite float: the shortest digits that read back as `v`,
/// the nearest of them (Python's dtoa mode 0), laid out by Python's rule:
/// positional for exponents -4..16, else `d.ddde+XX`.
pub fn write_float_repr(out: &mut Vec<u8>, v: f64) {
    debug_assert!(v.is_finite());
    // Rust's `{:e}` gives the shortest digits that read back as `v`; where
    // two such strings are equally near `v` it may pick the other one than
    // Python (which takes the nearest, ties to even). At that length, the
    // correctly rounded digits are Python's.
    let shortest = format!("{v:e}"); // "-1.2345e-5", "1e16", "0e0"
    let n = shortest
        .split('e')
        .next()
        .map_or(1, |m| m.bytes().filter(u8::is_ascii_digit).count());
    let rounded = format!("{:.*e}", n.saturating_sub(1), v);
    // (A tie rounded to even may not read back, next to a power of two.)
    let sci = if rounded.parse::<f64>() == Ok(v) {
        rounded
    } else {
        shortest
    };
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` has an integer exponent");
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let mut digits = [0u8; 24];
    let mut n = 0;
    for b in mantissa.bytes().filter(u8::is_ascii_digit) {
        digits[n] = b;
        n += 1;
    }
    let digits = &digits[..n];
    if negative {
        out.push(b'-');
    }
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-point) as usize));
            out.extend_from_slice(digits);
        } else if point as usize >= digits.len() {
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', point as usize - digits.len()));
            out.extend_from_slice(b".0");
        } else {
            let (whole, fraction) = digits.split_at(point as usize);
            out.extend_from_slice(whole);
            out.push(b'.');
            out.extend_from_slice(fraction);
        }
    } else {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.extend_from_slice(if exp < 0 { b"e-" } else { b"e+" });
        if exp.abs() < 10 {
            out.push(b'0');
        }
        write_int(out, i64::from(exp.abs()));
    }
}

/// A JSON string as `json.dumps(ensure_ascii=False)` writes it: `"` and
/// `\` escaped, the control characters below U+0020 as `\n`-style or
/// `\u00xx` escapes, everything else (DEL, U+2028 too) as its UTF-8.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..0x20 => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `base64.b64encode(data)`: the standard alphabet, `=`-padded.
pub fn write_base64(out: &mut Vec<u8>, data: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sym = |v: u32, shift: u32| ALPHABET[((v >> shift) & 63) as usize];
    out.reserve(data.len().div_ceil(3) * 4);
    let mut triples = data.chunks_exact(3);
    for t in &mut triples {
        let v = u32::from(t[0]) << 16 | u32::from(t[1]) << 8 | u32::from(t[2]);
        out.extend_from_slice(&[sym(v, 18), sym(v, 12), sym(v, 6), sym(v, 0)]);
    }
    match *triples.remainder() {
        [a] => {
            let v = u32::from(a) << 16;
            out.extend_from_slice(&[sym(v, 18), sym(v, 12), b'=', b'=']);
        }
        [a, b] => {
            let v = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend_from_slice(&[sym(v, 18), sym(v, 12), sym(v, 6), b'=']);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(v: f64) -> String {
        let mut out = Vec::new();
        write_float_repr(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_as_python_repr_writes_them() {
        // Python's repr of each, as printed by CPython.
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.7, "0.7"),
            (-2.5, "-2.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123_456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.234_5e16, "1.2345e+16"),
            (1e100, "1e+100"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
            (5e-324, "5e-324"),
            (9_007_199_254_740_993.0, "9007199254740992.0"),
            // Two shortest strings equally near the value: Python's is the even one.
            (562_949_953_421_312.2, "562949953421312.2"),
            (5.960_464_477_539_063e-8, "5.960464477539063e-08"),
        ];
        for &(v, want) in cases {
            assert_eq!(repr(v), want, "{v:e}");
        }
    }

    #[test]
    fn ints_of_every_width() {
        for v in [
            0,
            7,
            -7,
            10,
            99,
            100,
            -100,
            12_345,
            i64::from(i32::MAX),
            i64::MAX,
            i64::MIN,
        ] {
            let mut out = Vec::new();
            write_int(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), v.to_string());
        }
    }

    #[test]
    fn strings_escaped_as_json_dumps_escapes_them() {
        let mut out = Vec::new();
        write_string(&mut out, "a\"b\\c\nd\re\tf\u{8}\u{c}\u{1}\u{1f} \u{7f}é\u{2028}");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\"a\\\"b\\\\c\\nd\\re\\tf\\b\\f\\u0001\\u001f \u{7f}é\u{2028}\""
        );
    }

    #[test]
    fn base64_of_every_remainder() {
        for (data, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
            (b"\x00\xff\xfe", "AP/+"),
        ] {
            let mut out = Vec::new();
            write_base64(&mut out, data);
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }

    #[test]
    fn nested_values_without_trailing_commas() {
        let mut json = Json::with_capacity(0);
        json.begin_object();
        json.key("a");
        json.ints(&[1i32, -2]);
        json.key("b");
        json.begin_array();
        json.end_array();
        json.key("c");
        json.begin_object();
        json.end_object();
        json.key("d");
        assert!(json.float(1.0));
        assert!(!json.float(f64::NAN));
        json.key("e");
        json.bool(false);
        json.end_object();
        assert_eq!(json.into_bytes(), br#"{"a":[1,-2],"b":[],"c":{},"d":1.0,"e":false}"#);
    }
}
