//! The cuDNN algorithm choices of [`super::conv`]'s benchmark search, kept in a file so that the
//! next run on the same GPU and cuDNN starts with them instead of timing every algorithm again
//! (and so that a profiler run, whose launch interception distorts the timing, uses the
//! algorithms of a normal run).
//!
//! The file ([`CACHE_ENV`], by default `$XDG_CACHE_HOME/yolo9/cudnn-algos.txt`, else
//! `$HOME/.cache/yolo9/cudnn-algos.txt`) holds one line per choice:
//! `GPU name | cuDNN version | f32 math | kind | N,C,H,W,K,kh,kw,pad,stride,groups | dtype | strict | algorithm`
//! (fields separated by tabs; the algorithm as cuDNN's enum value). Lines of another GPU, cuDNN
//! version or math type are ignored; a later line wins over an earlier one. New choices are
//! appended (one `write` per line, so concurrent runs interleave whole lines). A file that cannot
//! be read or written only costs the timing: the search then runs as without a cache, with one
//! warning.

use super::conv_params::Conv2dParams;
use candle_core::DType;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

/// Environment variable naming the cache file; `off` (or empty) disables the cache.
pub const CACHE_ENV: &str = "YOLO9_CUDNN_CACHE";

/// Which of the three convolutions a choice is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `cudnnConvolutionForward`.
    Forward,
    /// `cudnnConvolutionBackwardData`.
    BackwardData,
    /// `cudnnConvolutionBackwardFilter`.
    BackwardFilter,
    /// A fused convolution graph ([`super::fused_conv`]): the input's row stride and byte
    /// alignment, SiLU, a residual; the value is the engine configuration's position in cuDNN's
    /// heuristics list.
    Fused {
        /// The input's row stride (elements).
        ld: usize,
        /// The byte alignment of the input's first element.
        align: u8,
        /// SiLU after the bias.
        silu: bool,
        /// A residual added last.
        residual: bool,
        /// The output's row stride (elements) where it is a channel slice of a larger tensor
        /// (a concatenation built in place); 0 for a contiguous output.
        yld: usize,
    },
}

impl Kind {
    fn tag(self) -> String {
        match self {
            Kind::Forward => "fwd".into(),
            Kind::BackwardData => "bwd_data".into(),
            Kind::BackwardFilter => "bwd_filter".into(),
            Kind::Fused {
                ld,
                align,
                silu,
                residual,
                yld,
            } => {
                let base = format!(
                    "fused/{ld}/{align}/{}/{}",
                    u8::from(silu),
                    u8::from(residual)
                );
                if yld == 0 {
                    base
                } else {
                    format!("{base}/{yld}")
                }
            }
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "fwd" => Kind::Forward,
            "bwd_data" => Kind::BackwardData,
            "bwd_filter" => Kind::BackwardFilter,
            _ => {
                let f: Vec<&str> = s.strip_prefix("fused/")?.split('/').collect();
                let (ld, align, silu, residual, yld) = match f[..] {
                    [ld, align, silu, residual] => (ld, align, silu, residual, "0"),
                    [ld, align, silu, residual, yld] => (ld, align, silu, residual, yld),
                    _ => return None,
                };
                Kind::Fused {
                    ld: ld.parse().ok()?,
                    align: align.parse().ok()?,
                    silu: silu == "1",
                    residual: residual == "1",
                    yld: yld.parse().ok()?,
                }
            }
        })
    }
}

type Key = (Kind, Conv2dParams, DType, bool);

/// The choices of one GPU, cuDNN version and math type, and the file they persist in.
pub struct AlgoCache {
    path: PathBuf,
    /// `GPU \t cuDNN \t math`: the first three fields of this process's lines.
    prefix: String,
    entries: HashMap<Key, u32>,
    warned: bool,
}

/// The cache file's path from [`CACHE_ENV`] and the XDG/HOME defaults (`None`: disabled).
pub fn default_path() -> Option<PathBuf> {
    match crate::switches::var(CACHE_ENV) {
        Some(v) if v.trim().is_empty() || v.trim() == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => {
            let base = crate::switches::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| {
                    crate::switches::var_os("HOME").map(|h| PathBuf::from(h).join(".cache"))
                })?;
            Some(base.join("yolo9").join("cudnn-algos.txt"))
        }
    }
}

fn params_field(p: &Conv2dParams) -> String {
    let f = format!(
        "{},{},{},{},{},{},{},{},{},{}",
        p.batch, p.c_in, p.h, p.w, p.c_out, p.kh, p.kw, p.padding, p.stride, p.groups
    );
    // Channels-last shapes carry an eleventh field; NCHW lines keep the older ten-field form.
    if p.nhwc {
        format!("{f},nhwc")
    } else {
        f
    }
}

fn parse_params(s: &str) -> Option<Conv2dParams> {
    let (s, nhwc) = match s.strip_suffix(",nhwc") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse().ok())
        .collect::<Option<_>>()?;
    let [batch, c_in, h, w, c_out, kh, kw, padding, stride, groups] = v[..] else {
        return None;
    };
    Some(Conv2dParams {
        batch,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        padding,
        stride,
        groups,
        nhwc,
    })
}

fn parse_dtype(s: &str) -> Option<DType> {
    match s {
        "F32" => Some(DType::F32),
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    }
}

impl AlgoCache {
    /// Loads the lines of `path` that match `gpu`, `cudnn` (version) and `math` (the f32 math
    /// type's name). A missing file is an empty cache.
    pub fn open(path: PathBuf, gpu: &str, cudnn: usize, math: &str) -> Self {
        let prefix = format!("{}\t{cudnn}\t{math}", gpu.replace('\t', " "));
        let mut entries = HashMap::new();
        if let Ok(text) = crate::bounded::read_text_capped(&path, crate::bounded::FileKind::Record)
        {
            for line in text.lines() {
                let Some(rest) = line.strip_prefix(&prefix) else {
                    continue;
                };
                let f: Vec<&str> = rest.trim_start_matches('\t').split('\t').collect();
                let [kind, params, dtype, strict, algo] = f[..] else {
                    continue;
                };
                let Some(kind) = Kind::parse(kind) else {
                    continue;
                };
                let (Some(p), Some(d), Ok(algo)) = (
                    parse_params(params),
                    parse_dtype(dtype),
                    algo.parse::<u32>(),
                ) else {
                    continue;
                };
                entries.insert((kind, p, d, strict == "1"), algo);
            }
        }
        AlgoCache {
            path,
            prefix,
            entries,
            warned: false,
        }
    }

    /// The cache file of the device of `stream` ([`default_path`]; `None` when disabled), keyed
    /// by the GPU's name, the loaded cuDNN's version and `math` (what else the choices depend
    /// on: the math type of [`super::conv`], `graph` for [`super::fused_conv`]).
    pub fn for_stream(stream: &cudarc::driver::CudaStream, math: &str) -> Option<Self> {
        let path = default_path()?;
        let ctx = stream.context();
        let gpu = ctx
            .name()
            .unwrap_or_else(|_| format!("cuda:{}", ctx.ordinal()));
        Some(Self::open(
            path,
            &gpu,
            cudarc::cudnn::result::get_version(),
            math,
        ))
    }

    /// The cached algorithm (cuDNN enum value) of a convolution, if any.
    pub fn get(&self, kind: Kind, p: &Conv2dParams, dtype: DType, strict: bool) -> Option<u32> {
        self.entries.get(&(kind, *p, dtype, strict)).copied()
    }

    /// Records a choice and appends it to the file (warns once if the file cannot be written).
    pub fn put(&mut self, kind: Kind, p: &Conv2dParams, dtype: DType, strict: bool, algo: u32) {
        self.entries.insert((kind, *p, dtype, strict), algo);
        let line = format!(
            "{}\t{}\t{}\t{dtype:?}\t{}\t{algo}\n",
            self.prefix,
            kind.tag(),
            params_field(p),
            u8::from(strict)
        );
        let r = (|| -> std::io::Result<()> {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = crate::outfile::open_append(&self.path)
                .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
            f.write_all(line.as_bytes())
        })();
        if let Err(e) = r {
            if !self.warned {
                self.warned = true;
                tracing::warn!(
                    "cuDNN algorithm cache {}: {e} (choices are not kept for the next run; set \
                     {CACHE_ENV}=off to silence this)",
                    crate::text::path(&self.path)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Kind;

    /// Every kind's tag reads back as the same kind; a fused tag of the four fields written
    /// before the output stride existed reads as a contiguous output; malformed tags are refused.
    #[test]
    fn kind_tags_round_trip_and_old_fused_tags_still_read() {
        let fused = |yld| Kind::Fused {
            ld: 96,
            align: 16,
            silu: true,
            residual: false,
            yld,
        };
        for k in [
            Kind::Forward,
            Kind::BackwardData,
            Kind::BackwardFilter,
            fused(0),
            fused(384),
        ] {
            assert_eq!(Kind::parse(&k.tag()), Some(k), "{}", k.tag());
        }
        assert_eq!(fused(0).tag(), "fused/96/16/1/0");
        assert_eq!(fused(384).tag(), "fused/96/16/1/0/384");
        assert_eq!(Kind::parse("fused/96/16/1/0"), Some(fused(0)));
        for bad in [
            "fused/96/16/1",
            "fused/96/16/1/0/x",
            "fused/a/16/1/0",
            "fwdx",
        ] {
            assert_eq!(Kind::parse(bad), None, "{bad}");
        }
    }
}
