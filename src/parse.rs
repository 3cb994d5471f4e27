//! Parsers of option values, shared by the library's option types ([`crate::train::options`],
//! [`crate::detect::config`]) and the subcommands that derive their flags from them, so that an
//! option means the same and is checked the same everywhere: a bad value is refused when the
//! command line is parsed, with the valid range, before any work starts. Each returns the error
//! text clap prints after the flag's name.

/// Largest `--img` of any subcommand, pixels.
pub const MAX_IMG: u32 = 8192;

/// Most loader threads `--workers` accepts.
pub const MAX_WORKERS: usize = 256;

fn int(s: &str, what: &str, range: &str) -> Result<i64, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' is not an integer; {what} must be in {range}"))
}

/// `--img` of detect and val: an integer in 1..=[`MAX_IMG`] (rounded up to a multiple of 32, with
/// a notice, when running).
pub fn img(s: &str) -> Result<u32, String> {
    let range = format!("1..={MAX_IMG} pixels");
    let v = int(s, "--img", &range)?;
    if !(1..=i64::from(MAX_IMG)).contains(&v) {
        return Err(format!("{v} is out of range; --img must be in {range}"));
    }
    Ok(v as u32)
}

/// `--img` of train: a multiple of 32 in 32..=[`MAX_IMG`] (the training graph and the mosaic work
/// on the stride grid, so nothing is rounded silently).
pub fn train_img(s: &str) -> Result<u32, String> {
    let range = format!("32..={MAX_IMG} pixels, a multiple of 32");
    let v = int(s, "--img", &range)?;
    if !(32..=i64::from(MAX_IMG)).contains(&v) || v % 32 != 0 {
        let near = ((v.clamp(32, i64::from(MAX_IMG)) + 16) / 32 * 32).clamp(32, MAX_IMG as i64);
        return Err(format!(
            "{v} is not valid; --img must be {range} (nearest: {near})"
        ));
    }
    Ok(v as u32)
}

/// A threshold (`--conf-thres`, `--iou-thres`): a finite number in [0, 1].
pub fn unit(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number; the valid range is [0, 1]"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is outside the valid range [0, 1]"));
    }
    Ok(v)
}

/// [`unit`] as an f32 (the confidence threshold of detection).
pub fn unit_f32(s: &str) -> Result<f32, String> {
    unit(s).map(|v| v as f32)
}

/// A count that must be at least 1 (`--max-det`, `--micro-batch`, val's `--batch`).
pub fn positive(s: &str) -> Result<usize, String> {
    let v = int(s, "the value", "1 or more")?;
    if v < 1 {
        return Err(format!("{v} is out of range; the value must be at least 1"));
    }
    usize::try_from(v).map_err(|_| format!("{v} is too large"))
}

/// `--workers`: 0 (automatic: cores − 1) up to [`MAX_WORKERS`].
pub fn workers(s: &str) -> Result<usize, String> {
    let range = format!("0..={MAX_WORKERS} (0 = available cores - 1)");
    let v = int(s, "--workers", &range)?;
    if !(0..=MAX_WORKERS as i64).contains(&v) {
        return Err(format!("{v} is out of range; --workers must be in {range}"));
    }
    Ok(v as usize)
}

/// `--batch` of train: a positive number, or `auto` (returned as 0: sized by the memory budget).
pub fn batch(s: &str) -> Result<usize, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(0);
    }
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "invalid batch '{s}': expected a positive number or 'auto'"
        )),
    }
}

/// `--budget`: a memory size such as `8GiB`, `512MiB` or a byte count
/// ([`crate::memory::parse_size`]), in bytes.
pub fn budget(s: &str) -> Result<u64, String> {
    crate::memory::parse_size(s).map_err(|e| format!("{e}"))
}

/// `--time`: a positive, finite number of hours.
pub fn hours(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(h) if h.is_finite() && h > 0.0 => Ok(h),
        _ => Err(format!(
            "invalid --time '{s}': expected a positive number of hours (e.g. 1.5)"
        )),
    }
}

/// `--label-smoothing`: epsilon in [0, 1).
pub fn smoothing(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(e) if (0.0..1.0).contains(&e) => Ok(e),
        _ => Err(format!(
            "invalid --label-smoothing '{s}': expected a number in [0, 1) (e.g. 0.1)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_accept_their_range_and_name_it_otherwise() {
        assert_eq!(img("640"), Ok(640));
        assert!(img("0").unwrap_err().contains("1..=8192"));
        assert!(img("100000").is_err());
        assert_eq!(train_img("640"), Ok(640));
        assert!(train_img("100000").unwrap_err().contains("nearest: 8192"));
        assert!(train_img("650").unwrap_err().contains("nearest: 640"));
        assert!(train_img("16").is_err());
        assert_eq!(unit("0.25"), Ok(0.25));
        for bad in ["2", "-0.1", "nan", "inf", "x"] {
            assert!(unit(bad).is_err(), "{bad}");
        }
        assert_eq!(positive("3"), Ok(3));
        assert!(positive("0").is_err());
        assert!(positive("-2").is_err());
        assert_eq!(workers("0"), Ok(0));
        assert!(workers("1000").unwrap_err().contains("0..=256"));
        assert_eq!((batch("auto"), batch(" 8 ")), (Ok(0), Ok(8)));
        assert!(batch("0").unwrap_err().contains("'auto'"));
        assert_eq!(budget("1GiB"), Ok(1 << 30));
        assert!(budget("lots").is_err());
        assert_eq!(hours("0.5"), Ok(0.5));
        for bad in ["0", "-1", "inf", "x"] {
            assert!(hours(bad).is_err(), "{bad}");
        }
        assert_eq!(smoothing("0.1"), Ok(0.1));
        assert!(smoothing("1").is_err());
    }
}
