//! The zip layout of a `torch.save` checkpoint (PyTorch ≥ 1.6) and reading its tensors.
//!
//! Layout: every record sits under one prefix directory derived by `torch.save` from the file
//! name (`yolov9-s/`, `best/`, ...; never assume `archive/`): `<prefix>/data.pkl` (the pickled
//! object), `<prefix>/byteorder` (`little`), `<prefix>/version`, and one record
//! `<prefix>/data/<key>` per tensor storage, holding its raw little-endian elements.
//!
//! A tensor is `_rebuild_tensor_v2(storage, offset, size, stride)` (offsets and strides in
//! elements); [`read_tensor`] gathers it into a contiguous row-major candle tensor on the CPU,
//! upcasting floating-point types to f32 (exact for f16/bf16) and keeping int64 as int64.

use super::pickle::{StorageDType, TensorRef};
use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use std::io::{Read, Seek};
use std::path::Path;

/// Largest single record we agree to read (4 GiB): anything bigger is not a YOLOv9 checkpoint.
pub const MAX_RECORD_BYTES: u64 = 4 << 30;
/// Largest `data.pkl` we agree to read.
pub const MAX_PICKLE_BYTES: u64 = 256 << 20;

/// An opened checkpoint zip.
pub struct Checkpoint<R: Read + Seek> {
    zip: zip::ZipArchive<R>,
    /// The record prefix, e.g. `yolov9-s` (records are `<prefix>/...`).
    pub prefix: String,
    /// The file name, for error messages.
    pub file: String,
}

impl Checkpoint<std::io::BufReader<std::fs::File>> {
    /// Opens `path` as a torch zip checkpoint and locates its single `<prefix>/data.pkl`.
    pub fn open(path: &Path) -> Result<Self> {
        let f = std::fs::File::open(path)
            .with_context(|| format!("{}: cannot open the checkpoint", crate::text::path(&path)))?;
        Self::new(
            std::io::BufReader::new(f),
            &crate::text::path(&path).to_string(),
        )
    }
}

impl<R: Read + Seek> Checkpoint<R> {
    /// Opens a torch zip checkpoint from a reader; `file` names it in errors.
    pub fn new(reader: R, file: &str) -> Result<Self> {
        let zip = zip::ZipArchive::new(reader).map_err(|e| {
            anyhow::anyhow!(
                "{file}: not a readable PyTorch zip checkpoint ({e}); the file is truncated or \
                 damaged: download or copy it again"
            )
        })?;
        let names: Vec<String> = zip
            .file_names()
            .filter_map(|n| n.ok().map(|n| n.into_owned()))
            .collect();
        let mut pkls = Vec::new();
        for name in &names {
            if let Some(prefix) = name.strip_suffix("/data.pkl") {
                if !prefix.is_empty() && !prefix.contains('/') {
                    pkls.push(prefix.to_string());
                }
            }
        }
        let prefix = match pkls.len() {
            1 => pkls.remove(0),
            0 => {
                let some: Vec<&String> = names.iter().take(5).collect();
                bail!(
                    "{file}: no <prefix>/data.pkl record: this zip is not a PyTorch checkpoint \
                     (it holds {} records, e.g. {some:?})",
                    zip.len()
                )
            }
            _ => bail!(
                "{file}: several data.pkl records ({pkls:?}): not a single torch.save checkpoint"
            ),
        };
        let mut ck = Self {
            zip,
            prefix,
            file: file.to_string(),
        };
        if let Some(order) = ck.read_small_record("byteorder")? {
            if order.trim() != "little" {
                bail!(
                    "{file}: checkpoint was saved on a {:?}-endian machine; only little-endian \
                     checkpoints are supported: re-save it on a little-endian machine",
                    order.trim()
                )
            }
        }
        Ok(ck)
    }

    fn read_small_record(&mut self, rel: &str) -> Result<Option<String>> {
        let name = format!("{}/{rel}", self.prefix);
        if self.zip.index_for_name(&name).is_none() {
            return Ok(None);
        }
        let bytes = self.read_record(&name, 1 << 16)?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Reads a whole record of at most `limit` bytes.
    fn read_record(&mut self, name: &str, limit: u64) -> Result<Vec<u8>> {
        let file = self.file.clone();
        let mut entry = self
            .zip
            .by_name(name)
            .map_err(|e| anyhow::anyhow!("{file}: record {name}: {e}"))?;
        let size = entry.size();
        if size > limit {
            bail!("{file}: record {name} declares {size} bytes, more than the {limit} accepted")
        }
        let mut buf = Vec::new();
        (&mut entry).take(size).read_to_end(&mut buf).map_err(|e| {
            anyhow::anyhow!("{file}: record {name} is damaged ({e}): copy the file again")
        })?;
        if buf.len() as u64 != size {
            bail!(
                "{file}: record {name} is truncated: {} of {size} bytes",
                buf.len()
            )
        }
        // The zip reader checks the CRC-32 only when it is read to its end, which `take(size)`
        // never does: every record is checked here, before any of its bytes is used.
        let (expected, actual) = (entry.crc32(), crc32fast::hash(&buf));
        if expected != actual {
            bail!(
                "{file}: record {name} is damaged: its bytes have CRC-32 {actual:08x} where the \
                 zip records {expected:08x} (the file was altered or corrupted after it was \
                 written); download or copy it again"
            )
        }
        Ok(buf)
    }

    /// The raw bytes of `<prefix>/data.pkl`.
    pub fn pickle_bytes(&mut self) -> Result<Vec<u8>> {
        let name = format!("{}/data.pkl", self.prefix);
        self.read_record(&name, MAX_PICKLE_BYTES)
    }

    /// All record names (for reports).
    pub fn record_names(&self) -> Vec<String> {
        self.zip
            .file_names()
            .filter_map(|n| n.ok().map(|n| n.into_owned()))
            .collect()
    }

    /// Reads the tensor `name` described by `t` from its storage record.
    ///
    /// Errors (never panics) when the storage record is missing, shorter than the storage the
    /// pickle declares, or when the view (offset, shape, stride) reaches past the storage.
    pub fn read_tensor(&mut self, name: &str, t: &TensorRef) -> Result<Tensor> {
        let file = self.file.clone();
        let esize = t.dtype.size() as u64;
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .filter(|&n| n.saturating_mul(esize) <= MAX_RECORD_BYTES)
            .with_context(|| format!("{file}: tensor {name} has an absurd shape {:?}", t.shape))?;
        let storage_bytes = t
            .storage_numel
            .checked_mul(esize)
            .filter(|&b| b <= MAX_RECORD_BYTES)
            .with_context(|| {
                format!(
                    "{file}: tensor {name}: storage data/{} declares an absurd size of {} elements",
                    t.storage_key, t.storage_numel
                )
            })?;
        // Last element reached by the view (only when it has elements).
        if numel > 0 {
            let mut last = t.offset;
            for (&d, &s) in t.shape.iter().zip(&t.stride) {
                last = (d as u64 - 1)
                    .checked_mul(s as u64)
                    .and_then(|x| x.checked_add(last))
                    .with_context(|| format!("{file}: tensor {name}: stride overflow"))?;
            }
            if last >= t.storage_numel {
                bail!(
                    "{file}: tensor {name} (shape {:?}, stride {:?}, offset {}) reaches element {last} \
                     but its storage data/{} has {} elements: the checkpoint is corrupt",
                    t.shape,
                    t.stride,
                    t.offset,
                    t.storage_key,
                    t.storage_numel
                )
            }
        }
        let rec = format!("{}/data/{}", self.prefix, t.storage_key);
        let actual = match self.zip.by_name(&rec) {
            Ok(e) => e.size(),
            Err(e) => bail!("{file}: tensor {name}: storage record {rec} missing ({e}): the checkpoint is incomplete"),
        };
        if actual < storage_bytes {
            bail!(
                "{file}: tensor {name}: storage record {rec} holds {actual} bytes but the pickle \
                 declares {} elements of {} bytes ({storage_bytes} bytes): the checkpoint is corrupt",
                t.storage_numel,
                esize
            )
        }
        let data = self.read_record(&rec, storage_bytes.max(actual))?;
        let data = &data[..storage_bytes as usize];
        let idx = element_indices(&t.shape, &t.stride, t.offset as usize);
        let shape = t.shape.clone();
        let dev = &Device::Cpu;
        let e = t.dtype.size();
        let at = |i: usize| &data[i * e..i * e + e];
        let tensor = match t.dtype {
            StorageDType::F16 => Tensor::from_vec(
                idx.map(|i| half::f16::from_le_bytes([at(i)[0], at(i)[1]]).to_f32())
                    .collect::<Vec<f32>>(),
                shape,
                dev,
            ),
            StorageDType::BF16 => Tensor::from_vec(
                idx.map(|i| half::bf16::from_le_bytes([at(i)[0], at(i)[1]]).to_f32())
                    .collect::<Vec<f32>>(),
                shape,
                dev,
            ),
            StorageDType::F32 => Tensor::from_vec(
                idx.map(|i| f32::from_le_bytes(at(i).try_into().unwrap_or([0; 4])))
                    .collect::<Vec<f32>>(),
                shape,
                dev,
            ),
            StorageDType::F64 => Tensor::from_vec(
                idx.map(|i| f64::from_le_bytes(at(i).try_into().unwrap_or([0; 8])) as f32)
                    .collect::<Vec<f32>>(),
                shape,
                dev,
            ),
            StorageDType::I64 => Tensor::from_vec(
                idx.map(|i| i64::from_le_bytes(at(i).try_into().unwrap_or([0; 8])))
                    .collect::<Vec<i64>>(),
                shape,
                dev,
            ),
            StorageDType::I32 => Tensor::from_vec(
                idx.map(|i| i32::from_le_bytes(at(i).try_into().unwrap_or([0; 4])) as i64)
                    .collect::<Vec<i64>>(),
                shape,
                dev,
            ),
            StorageDType::U8 => {
                Tensor::from_vec(idx.map(|i| data[i]).collect::<Vec<u8>>(), shape, dev)
            }
        };
        tensor.with_context(|| format!("{file}: tensor {name}: cannot build the tensor"))
    }
}

/// Storage indices of a strided view, in row-major order of the view (callers checked bounds).
fn element_indices(
    shape: &[usize],
    stride: &[usize],
    offset: usize,
) -> impl Iterator<Item = usize> {
    let numel: usize = shape.iter().product();
    let shape = shape.to_vec();
    let stride = stride.to_vec();
    let mut counter = vec![0usize; shape.len()];
    let mut cur = offset;
    (0..numel).map(move |k| {
        if k > 0 {
            // advance the odometer
            for d in (0..shape.len()).rev() {
                counter[d] += 1;
                cur += stride[d];
                if counter[d] < shape[d] {
                    break;
                }
                cur -= stride[d] * shape[d];
                counter[d] = 0;
            }
        }
        cur
    })
}

#[cfg(test)]
mod tests {
    use super::element_indices;

    #[test]
    fn strided_indices_match_hand_computed() {
        // contiguous 2x3
        let v: Vec<usize> = element_indices(&[2, 3], &[3, 1], 0).collect();
        assert_eq!(v, vec![0, 1, 2, 3, 4, 5]);
        // transposed view of a 3x2 storage (shape 2x3, stride 1,2), offset 1
        let v: Vec<usize> = element_indices(&[2, 3], &[1, 2], 1).collect();
        assert_eq!(v, vec![1, 3, 5, 2, 4, 6]);
        // scalar
        let v: Vec<usize> = element_indices(&[], &[], 7).collect();
        assert_eq!(v, vec![7]);
        // empty
        assert_eq!(element_indices(&[0, 4], &[4, 1], 0).count(), 0);
    }
}
