//! Converter and weights I/O against the official PyTorch oracle (`../shared/reference`, README
//! §1, §2, §8) and the bad-input cases (`../shared/cases/checkpoint_truncated`).

use crate::common;

use common::tmpdir;

use candle_core::{DType, Tensor};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use yolo9::convert::{self, ConvertOptions};
use yolo9::internals::model::keys;
use yolo9::model::weights::default_arch;
use yolo9::{Graph, Weights};

/// Little-endian bytes of a tensor as the index hashes them (f32, or i64 for counters).
fn le_bytes(t: &Tensor) -> Vec<u8> {
    let flat = t.flatten_all().unwrap();
    match t.dtype() {
        DType::I64 => flat
            .to_vec1::<i64>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::F32 => flat
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        d => panic!("unexpected dtype {d:?}"),
    }
}

fn sha_hex(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

struct IndexEntry {
    shape: Vec<usize>,
    dtype: String,
    sha: String,
}

/// `yolov9-s.state_dict.index.json`: name → (shape, dtype, sha256_le), in state_dict order.
fn index() -> Vec<(String, IndexEntry)> {
    let text = std::fs::read_to_string(common::reference("yolov9-s.state_dict.index.json"))
        .expect("index json");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                IndexEntry {
                    shape: e["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_u64().unwrap() as usize)
                        .collect(),
                    dtype: e["dtype"].as_str().unwrap().to_string(),
                    sha: e["sha256_le"].as_str().unwrap().to_string(),
                },
            )
        })
        .collect()
}

fn assert_same_tensors(a: &Weights, b: &Weights) {
    let mut an: Vec<&String> = a.tensors.keys().collect();
    let mut bn: Vec<&String> = b.tensors.keys().collect();
    an.sort();
    bn.sort();
    assert_eq!(an, bn, "tensor names differ");
    for (n, t) in &a.tensors {
        let u = &b.tensors[n];
        assert_eq!(t.dims(), u.dims(), "{n}: shape");
        assert_eq!(t.dtype(), u.dtype(), "{n}: dtype");
        assert_eq!(le_bytes(t), le_bytes(u), "{n}: bytes differ");
    }
}

/// Elements of yolov9-s.pt that are -0.0 and became +0.0 in the official
/// yolov9-s-converted.pt (measured; see `converted_checkpoint_and_infer_mapping_match_official`).
const SIGNED_ZERO_DIFFS: usize = 5;

/// Same names, shapes and values (f32 `==`); returns how many elements differ in their bits,
/// asserting that every such difference is -0.0 in `a` vs +0.0 in `b`.
fn zero_sign_differences(a: &Weights, b: &Weights) -> usize {
    let mut an: Vec<&String> = a.tensors.keys().collect();
    let mut bn: Vec<&String> = b.tensors.keys().collect();
    an.sort();
    bn.sort();
    assert_eq!(an, bn, "tensor names differ");
    let mut n = 0;
    for (name, t) in &a.tensors {
        let u = &b.tensors[name];
        assert_eq!(t.dims(), u.dims(), "{name}: shape");
        assert_eq!(t.dtype(), u.dtype(), "{name}: dtype");
        if t.dtype() == DType::I64 {
            assert_eq!(le_bytes(t), le_bytes(u), "{name}");
            continue;
        }
        let x: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let y: Vec<f32> = u.flatten_all().unwrap().to_vec1().unwrap();
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            if p.to_bits() != q.to_bits() {
                assert!(
                    *p == 0.0 && *q == 0.0 && p.is_sign_negative() && q.is_sign_positive(),
                    "{name}[{i}]: {p} vs {q}"
                );
                n += 1;
            }
        }
    }
    n
}

fn err_of<T, E: Into<anyhow::Error>>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{:#}", e.into()),
    }
}

#[test]
fn generated_key_list_equals_official_state_dict_order() {
    let idx = index();
    let names: Vec<String> = idx.iter().map(|(n, _)| n.clone()).collect();
    let s = default_arch(Graph::Train);
    assert_eq!(keys::state_dict_names(&s).unwrap(), names);
    let entries: Vec<(String, Vec<usize>)> = idx
        .iter()
        .map(|(n, e)| (n.clone(), e.shape.clone()))
        .collect();
    assert_eq!(keys::state_dict_entries(&s, 80).unwrap(), entries);
    assert_eq!(
        keys::state_dict_names(&default_arch(Graph::Infer))
            .unwrap()
            .len(),
        1339
    );
}

/// README §1: every state_dict entry of `torch.load(yolov9-s.pt)["model"].float()` with the same
/// name, shape and fp32/int64 bytes (sha256); 9,804,512 parameters; nc/names/strides/graph.
#[test]
fn official_checkpoint_matches_index_exactly() {
    let w = Weights::load(common::reference("yolov9-s.pt")).unwrap();
    let idx = index();
    assert_eq!(w.tensors.len(), 1772);
    assert_eq!(idx.len(), 1772);
    let mut floats = 0;
    for (name, e) in &idx {
        let t = w
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("missing {name}"));
        assert_eq!(t.dims(), e.shape.as_slice(), "{name}: shape");
        let want = if e.dtype == "int64" {
            DType::I64
        } else {
            floats += 1;
            DType::F32
        };
        assert_eq!(t.dtype(), want, "{name}: dtype");
        assert_eq!(sha_hex(&le_bytes(t)), e.sha, "{name}: sha256 of LE bytes");
    }
    assert_eq!(floats, 1481);
    assert_eq!(w.parameter_count(), 9_804_512);
    assert_eq!(w.meta.graph, Graph::Train);
    assert_eq!(w.meta.nc, 80);
    assert_eq!(w.meta.names.len(), 80);
    assert_eq!(
        (
            w.meta.names[0].as_str(),
            w.meta.names[16].as_str(),
            w.meta.names[17].as_str(),
            w.meta.names[79].as_str()
        ),
        ("person", "dog", "horse", "toothbrush")
    );
    assert_eq!(w.meta.strides, vec![8, 16, 32]);
    // num_batches_tracked = 1 everywhere (README §1)
    let nbt = w.tensors["model.0.bn.num_batches_tracked"]
        .to_scalar::<i64>()
        .unwrap();
    assert_eq!(nbt, 1);

    // The subset file holds full fp32 values of 72 entries: compare bit for bit.
    let sub = candle_core::safetensors::load(
        common::reference("yolov9-s.state_dict.subset.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert_eq!(sub.len(), 72);
    for (n, t) in &sub {
        assert_eq!(
            le_bytes(t),
            le_bytes(&w.tensors[n]),
            "{n}: subset values differ"
        );
    }
    // DFL weights are arange(16)
    let dfl: Vec<f32> = w.tensors["model.29.dfl2.conv.weight"]
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(dfl, (0..16).map(|i| i as f32).collect::<Vec<_>>());
}

/// README §2: the gelan-s re-parameterized checkpoint (graph infer, 1339 entries,
/// 7,226,208 parameters); our `--infer` mapping of yolov9-s.pt keeps the source bytes (index
/// hashes) and equals the official re-parameterized tensors value for value.
#[test]
fn converted_checkpoint_and_infer_mapping_match_official() {
    let conv = Weights::load(common::reference("yolov9-s-converted.pt")).unwrap();
    assert_eq!(conv.meta.graph, Graph::Infer);
    assert_eq!(conv.tensors.len(), 1339);
    assert_eq!(conv.parameter_count(), 7_226_208);
    assert_eq!(conv.meta.nc, 80);
    assert_eq!(conv.meta.names[0], "person");

    // Our mapping of yolov9-s.pt keeps the source bytes exactly (checked against the index).
    let train = Weights::load(common::reference("yolov9-s.pt")).unwrap();
    let ours = train.to_infer().unwrap();
    assert_eq!(ours.meta.graph, Graph::Infer);
    assert_eq!(ours.meta.names, conv.meta.names);
    assert_eq!(ours.parameter_count(), 7_226_208);
    let idx: HashMap<String, IndexEntry> = index().into_iter().collect();
    let mut checked = 0;
    let map = yolo9::internals::model::rename::NameMap::train_to_infer(&default_arch(Graph::Train));
    for train_name in keys::state_dict_names(&default_arch(Graph::Train)).unwrap() {
        if let Some(infer_name) = map.map(&train_name) {
            let t = &ours.tensors[&infer_name];
            let e = &idx[&train_name];
            assert_eq!(t.dims(), e.shape.as_slice(), "{infer_name}");
            assert_eq!(sha_hex(&le_bytes(t)), e.sha, "{infer_name} <- {train_name}");
            checked += 1;
        }
    }
    assert_eq!(checked, 1339);
    // The official notebook's output equals it value for value; its copy turned a few -0.0 of
    // the source into +0.0 (the notebook compares with ==), so bytes may differ only there.
    assert_eq!(zero_sign_differences(&ours, &conv), SIGNED_ZERO_DIFFS);

    // The CLI path: convert --infer --half, then load: still exactly the source bytes
    // (the checkpoint is fp16, so f16 storage is lossless).
    let dir = tmpdir("infer");
    let out = dir.join("gelan.safetensors");
    let rep = convert::convert_file(
        &common::reference("yolov9-s.pt"),
        &out,
        ConvertOptions {
            half: true,
            infer: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(rep.parameters, 7_226_208);
    assert_eq!(rep.imported, 1772);
    assert_eq!(rep.written, 1339);
    let back = Weights::load(&out).unwrap();
    assert_same_tensors(&back, &ours);
    assert_eq!(back.meta, conv.meta);
    let _ = std::fs::remove_dir_all(dir);
}

/// README §8: real trained weights, nc=3 with names from the checkpoint; save → load round trips
/// in f32 and f16 with metadata and provenance.
#[test]
fn bccd_round_trip_f32_and_half_with_metadata() {
    let src = common::reference("bccd-official-best.pt");
    let (w, prov, rep) = convert::convert(&src, &ConvertOptions::default()).unwrap();
    assert_eq!(w.meta.nc, 3);
    assert_eq!(w.meta.names, vec!["RBC", "WBC", "Platelets"]);
    assert_eq!(w.meta.graph, Graph::Train);
    assert_eq!(
        prov.sha256,
        "85bf540acea44420e7539839512e0e2156d91a7af40d6aa722be4e8f7c70a606"
    );
    assert_eq!(prov.file, "bccd-official-best.pt");
    assert_eq!(rep.imported, 1772);
    // nc=3: the class convs shrink from 80 to 3 outputs (6 of them, in_ch 128, + bias)
    assert_eq!(w.parameter_count(), 9_804_512 - 6 * 77 * (128 + 1));

    let dir = tmpdir("rt");
    for half in [false, true] {
        let p = dir.join(format!("bccd-{half}.safetensors"));
        w.save_with_provenance(&p, half, Some(&prov)).unwrap();
        let (back, bp) = Weights::load_with_provenance(&p).unwrap();
        assert_same_tensors(&w, &back);
        assert_eq!(back.meta, w.meta);
        assert_eq!(bp.as_ref(), Some(&prov));
        let size = std::fs::metadata(&p).unwrap().len();
        let float_bytes = if half { 2 } else { 4 };
        // 9,844,739 elements in all, of which 291 are int64 counters
        let expect = (9_844_739 - 291 - 6 * 77 * 129) as u64 * float_bytes + 291 * 8;
        assert!(
            size > expect && size < expect + 200_000,
            "half={half}: {size} bytes, tensor data {expect}"
        );
        // no temporary left behind by the atomic write
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
    // Plain save (no provenance) and overwrite in place.
    let p = dir.join("bccd-false.safetensors");
    w.save(&p, false).unwrap();
    let (_, bp) = Weights::load_with_provenance(&p).unwrap();
    assert_eq!(bp, None);
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------------------------
// A tiny pickle writer for hand-made checkpoints (state_dicts, forbidden globals, bad storages).

#[derive(Default)]
struct Pkl(Vec<u8>);

impl Pkl {
    fn op(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn global(&mut self, m: &str, n: &str) -> &mut Self {
        self.0.push(b'c');
        self.0.extend_from_slice(format!("{m}\n{n}\n").as_bytes());
        self
    }
    fn s(&mut self, s: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend((s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn int(&mut self, i: u64) -> &mut Self {
        if i < (1 << 31) {
            self.0.push(b'J');
            self.0.extend((i as i32).to_le_bytes());
        } else {
            self.0.extend([0x8a, 8]);
            self.0.extend(i.to_le_bytes());
        }
        self
    }
    fn tuple(&mut self, v: &[u64]) -> &mut Self {
        self.op(b"(");
        for &x in v {
            self.int(x);
        }
        self.op(b"t")
    }
    /// `_rebuild_tensor_v2(storage(key, numel), offset, shape, stride, False, OrderedDict())`
    fn tensor(
        &mut self,
        storage: &str,
        key: &str,
        numel: u64,
        offset: u64,
        shape: &[u64],
        stride: &[u64],
    ) -> &mut Self {
        self.global("torch._utils", "_rebuild_tensor_v2").op(b"(");
        self.op(b"(")
            .s("storage")
            .global("torch", storage)
            .s(key)
            .s("cpu");
        self.int(numel).op(b"tQ");
        self.int(offset).tuple(shape).tuple(stride).op(&[0x89]);
        self.global("collections", "OrderedDict").op(b")R");
        self.op(b"tR")
    }
}

fn write_zip(path: &Path, prefix: &str, records: &[(String, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, data) in records {
        z.start_file(format!("{prefix}/{name}"), opts).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

/// A plain `torch.save(state_dict)` file (no model object, no names) is accepted: built here
/// from the official gelan-s tensors, f32 storages, one tensor stored transposed (column-major
/// strides) and two sharing a storage at an offset. It must load to exactly the same tensors.
#[test]
fn plain_state_dict_pt_with_strided_and_shared_storages() {
    let reference = Weights::load(common::reference("yolov9-s-converted.pt")).unwrap();
    let names = keys::state_dict_names(&default_arch(Graph::Infer)).unwrap();
    let mut p = Pkl::default();
    p.op(&[0x80, 2])
        .global("collections", "OrderedDict")
        .op(b")R(");
    let mut records = vec![];
    let shared_a = "model.0.bn.weight";
    let shared_b = "model.0.bn.bias";
    let transposed = "model.2.cv1.conv.weight";
    for (i, name) in names.iter().enumerate() {
        let t = &reference.tensors[name];
        let dims: Vec<u64> = t.dims().iter().map(|&d| d as u64).collect();
        let numel: u64 = dims.iter().product();
        let key = i.to_string();
        p.s(name);
        if t.dtype() == DType::I64 {
            let v = t.flatten_all().unwrap().to_vec1::<i64>().unwrap();
            p.tensor("LongStorage", &key, 1, 0, &[], &[]);
            records.push((format!("data/{key}"), v[0].to_le_bytes().to_vec()));
            continue;
        }
        if name == shared_b {
            // lives in the storage of shared_a, after its 32 values
            p.tensor("FloatStorage", "shared", 64, 32, &dims, &[1]);
            continue;
        }
        if name == shared_a {
            let mut v = le_bytes(t);
            v.extend(le_bytes(&reference.tensors[shared_b]));
            p.tensor("FloatStorage", "shared", 64, 0, &dims, &[1]);
            records.push(("data/shared".into(), v));
            continue;
        }
        if name == transposed {
            // column-major storage: stride (1, d0, d0*d1, d0*d1*d2)
            let mut stride = vec![1u64];
            for d in &dims[..dims.len() - 1] {
                let last = *stride.last().unwrap();
                stride.push(last * d);
            }
            let perm: Vec<usize> = (0..dims.len()).rev().collect();
            let col = t.permute(perm).unwrap().contiguous().unwrap();
            p.tensor("FloatStorage", &key, numel, 0, &dims, &stride);
            records.push((format!("data/{key}"), le_bytes(&col)));
            continue;
        }
        let mut stride = vec![1u64; dims.len()];
        for k in (0..dims.len().saturating_sub(1)).rev() {
            stride[k] = stride[k + 1] * dims[k + 1];
        }
        p.tensor("FloatStorage", &key, numel, 0, &dims, &stride);
        records.push((format!("data/{key}"), le_bytes(t)));
    }
    p.op(b"u.");
    records.insert(0, ("data.pkl".into(), p.0.clone()));
    records.push(("byteorder".into(), b"little".to_vec()));
    let dir = tmpdir("plain");
    let path = dir.join("state_dict.pt");
    write_zip(&path, "archive", &records);

    let (w, notes, how, n) = Weights::load_detailed(&path).unwrap();
    assert_eq!(n, 1339);
    assert!(how.contains("(top level)"), "{how}");
    assert_eq!(w.meta.graph, Graph::Infer);
    assert_eq!(w.meta.nc, 80);
    assert_eq!(w.meta.names[0], "class0");
    assert!(notes.iter().any(|n| n.contains("class0")), "{notes:?}");
    assert_same_tensors(&w, &reference);

    // The same state_dict saved as plain safetensors (no yolo9 metadata) loads too.
    let st = dir.join("plain.safetensors");
    let map: HashMap<String, Tensor> = reference.tensors.clone();
    candle_core::safetensors::save(&map, &st).unwrap();
    let back = Weights::load(&st).unwrap();
    assert_eq!(back.meta.graph, Graph::Infer);
    assert_eq!(back.meta.nc, 80);
    assert_same_tensors(&back, &reference);
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Bad input: clear errors naming the file, never a panic.

#[test]
fn damaged_safetensors_cases() {
    let case = common::case("checkpoint_truncated");
    let e = err_of(Weights::load(case.join("zero_bytes.safetensors")));
    assert!(
        e.contains("zero_bytes.safetensors") && e.contains("empty file"),
        "{e}"
    );

    let e = err_of(Weights::load(case.join("truncated_70pct.safetensors")));
    assert!(
        e.contains("truncated_70pct.safetensors")
            && e.contains("truncated: header declares 20288 bytes of tensor data, file has 14083"),
        "{e}"
    );

    let e = err_of(Weights::load(case.join("tiny_good.safetensors")));
    assert!(
        e.contains("tiny_good.safetensors") && e.contains("missing tensor model.0.bn.running_mean"),
        "{e}"
    );

    let run = case.join("interrupted_run/weights");
    for f in ["last.safetensors", "last.safetensors.tmp"] {
        let e = err_of(Weights::load(run.join(f)));
        assert!(e.contains(f) && e.contains("truncated"), "{f}: {e}");
    }
    let e = err_of(Weights::load(run.join("best.safetensors")));
    assert!(e.contains("missing tensor"), "{e}");

    let dir = tmpdir("garbage");
    let g = dir.join("notes.safetensors");
    std::fs::write(&g, b"this is not a weights file at all\n").unwrap();
    let e = err_of(Weights::load(&g));
    assert!(
        e.contains("notes.safetensors") && e.contains("garbage header"),
        "{e}"
    );
    let e = err_of(Weights::load(dir.join("absent.safetensors")));
    assert!(e.contains("absent.safetensors"), "{e}");
    let e = err_of(Weights::load(&dir));
    assert!(e.contains(&dir.display().to_string()), "{e}");
    // Saving into a missing directory fails cleanly and leaves nothing behind.
    let mut w = Weights::load(common::reference("yolov9-s-converted.pt")).unwrap();
    let target = dir.join("no/such/dir/w.safetensors");
    let e = err_of(w.save(&target, true));
    assert!(e.contains("cannot create"), "{e}");
    assert!(!dir.join("no").exists());
    // A tensor of another model size is named with both shapes.
    let t = Tensor::zeros((16, 3, 3, 3), DType::F32, &candle_core::Device::Cpu).unwrap();
    w.tensors.insert("model.0.conv.weight".into(), t);
    let p = dir.join("small.safetensors");
    w.save(&p, false).unwrap();
    let e = err_of(Weights::load(&p));
    assert!(
        e.contains("model.0.conv.weight has shape [16, 3, 3, 3]") && e.contains("[32, 3, 3, 3]"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn truncated_and_non_zip_checkpoints() {
    let dir = tmpdir("trunc");
    let full = std::fs::read(common::reference("yolov9-s.pt")).unwrap();
    for frac in [0.5, 0.999, 0.01] {
        let p = dir.join(format!("cut-{frac}.pt"));
        std::fs::write(&p, &full[..(full.len() as f64 * frac) as usize]).unwrap();
        let e = err_of(Weights::load(&p));
        assert!(
            e.contains(&format!("cut-{frac}.pt")) && e.contains("truncated or damaged"),
            "{frac}: {e}"
        );
    }
    let p = dir.join("fake.pt");
    std::fs::write(&p, b"PK\x03\x04 definitely not a zip").unwrap();
    let e = err_of(Weights::load(&p));
    assert!(
        e.contains("fake.pt") && e.contains("not a readable PyTorch zip"),
        "{e}"
    );

    // A zip without data.pkl.
    let p = dir.join("nodata.pt");
    write_zip(&p, "nodata", &[("version".into(), b"3\n".to_vec())]);
    let e = err_of(Weights::load(&p));
    assert!(e.contains("nodata.pt") && e.contains("data.pkl"), "{e}");

    // A legacy (non-zip) torch.save pickle.
    let p = dir.join("legacy.pt");
    std::fs::write(&p, [0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc]).unwrap();
    let e = err_of(Weights::load(&p));
    assert!(e.contains("legacy"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 51, "silently damaged checkpoints": a `.pt` whose tensor record has flipped bytes (its
/// CRC-32 no longer matching, the zip's structure intact) is refused, naming the file and the
/// record, before any tensor is used; the same damage in `data.pkl` too.
#[test]
fn a_record_with_a_bad_crc_is_refused() {
    let dir = tmpdir("crc");
    let full = std::fs::read(common::reference("yolov9-s-converted.pt")).unwrap();
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(&full)).unwrap();
    let pick = |z: &mut zip::ZipArchive<_>, suffix: &str| -> (String, u64, u64) {
        let name = z
            .file_names()
            .filter_map(|n| n.ok())
            .find(|n| n.ends_with(suffix))
            .unwrap()
            .to_string();
        let e = z.by_name(&name).unwrap();
        (name, e.data_start().unwrap(), e.compressed_size())
    };
    for suffix in ["/data/0", "/data/1", "/data.pkl"] {
        let (name, start, len) = pick(&mut z, suffix);
        assert!(len > 4, "{name}");
        let mut bad = full.clone();
        // Flip bytes in the middle of the record (stored records: the bytes are the data).
        let at = (start + len / 2) as usize;
        bad[at] ^= 0x5a;
        bad[at + 1] ^= 0xa5;
        let p = dir.join("flipped.pt");
        std::fs::write(&p, &bad).unwrap();
        let e = err_of(Weights::load(&p));
        assert!(
            e.contains("flipped.pt") && e.contains(&name) && e.contains("CRC-32"),
            "{suffix}: {e}"
        );
    }
    // The undamaged file loads.
    Weights::load(common::reference("yolov9-s-converted.pt")).unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

fn pt_with_pickle(dir: &Path, name: &str, pkl: Vec<u8>, storages: &[(&str, Vec<u8>)]) -> PathBuf {
    let p = dir.join(name);
    let mut recs = vec![("data.pkl".to_string(), pkl)];
    for (k, v) in storages {
        recs.push((format!("data/{k}"), v.clone()));
    }
    write_zip(&p, "x", &recs);
    p
}

#[test]
fn forbidden_globals_are_refused_by_name() {
    let dir = tmpdir("evil");
    // os.system('echo pwned'): the classic malicious checkpoint.
    let mut p = Pkl::default();
    p.op(&[0x80, 2])
        .global("os", "system")
        .s("echo pwned")
        .op(&[0x85])
        .op(b"R.");
    let f = pt_with_pickle(&dir, "evil.pt", p.0, &[]);
    let e = err_of(Weights::load(&f));
    assert!(
        e.contains("evil.pt") && e.contains("`os.system`") && e.contains("allow-list"),
        "{e}"
    );
    // Hidden inside an otherwise fine state_dict, after a tensor.
    let mut p = Pkl::default();
    p.op(&[0x80, 2]).op(b"}(").s("w");
    p.tensor("FloatStorage", "0", 1, 0, &[1], &[1]);
    p.s("x")
        .global("builtins", "eval")
        .s("1")
        .op(&[0x85])
        .op(b"R");
    p.op(b"u.");
    let f = pt_with_pickle(&dir, "sneaky.pt", p.0, &[("0", vec![0; 4])]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("`builtins.eval`"), "{e}");
    // subprocess via a models.* look-alike module name
    let mut p = Pkl::default();
    p.op(&[0x80, 2])
        .global("models.common.os", "system")
        .op(b").");
    let f = pt_with_pickle(&dir, "lookalike.pt", p.0, &[]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("`models.common.os.system`"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_storages_and_hostile_pickles_give_errors() {
    let dir = tmpdir("storage");
    let one = |storage_numel: u64, shape: &[u64], stride: &[u64], offset: u64| {
        let mut p = Pkl::default();
        p.op(&[0x80, 2]).op(b"}(").s("model.0.conv.weight");
        p.tensor("HalfStorage", "0", storage_numel, offset, shape, stride);
        p.op(b"u.");
        p.0
    };
    // storage record shorter than the storage the pickle declares
    let f = pt_with_pickle(
        &dir,
        "short.pt",
        one(1000, &[1000], &[1], 0),
        &[("0", vec![0; 20])],
    );
    let e = err_of(Weights::load(&f));
    assert!(
        e.contains("short.pt") && e.contains("holds 20 bytes"),
        "{e}"
    );
    // view reaching past the storage
    let f = pt_with_pickle(
        &dir,
        "past.pt",
        one(10, &[4, 4], &[4, 1], 0),
        &[("0", vec![0; 20])],
    );
    let e = err_of(Weights::load(&f));
    assert!(e.contains("reaches element 15"), "{e}");
    // absurd shape
    let f = pt_with_pickle(
        &dir,
        "absurd.pt",
        one(10, &[1 << 40, 1 << 40], &[1, 1], 0),
        &[("0", vec![0; 20])],
    );
    let e = err_of(Weights::load(&f));
    assert!(e.contains("absurd shape"), "{e}");
    // absurd storage size
    let f = pt_with_pickle(
        &dir,
        "huge.pt",
        one(1 << 62, &[2], &[1], 0),
        &[("0", vec![0; 20])],
    );
    let e = err_of(Weights::load(&f));
    assert!(e.contains("absurd size"), "{e}");
    // missing storage record
    let f = pt_with_pickle(&dir, "nostore.pt", one(10, &[10], &[1], 0), &[]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("x/data/0") && e.contains("missing"), "{e}");
    // a well-formed storage but not a YOLO model
    let f = pt_with_pickle(
        &dir,
        "tiny.pt",
        one(10, &[10], &[1], 0),
        &[("0", vec![0; 20])],
    );
    let e = err_of(Weights::load(&f));
    assert!(e.contains("tiny.pt") && e.contains("missing tensor"), "{e}");
    // a string longer than the stream
    let mut bad = vec![0x80, 2, b'X'];
    bad.extend(u32::MAX.to_le_bytes());
    bad.extend(b"abc");
    let f = pt_with_pickle(&dir, "longstr.pt", bad, &[]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("runs past the end"), "{e}");
    // pickle cut short (no STOP)
    let mut p = Pkl::default();
    p.op(&[0x80, 2]).op(b"}(").s("a");
    let f = pt_with_pickle(&dir, "nostop.pt", p.0, &[]);
    let e = err_of(Weights::load(&f));
    assert!(
        e.contains("nostop.pt") && e.contains("truncated pickle"),
        "{e}"
    );
    // deep nesting: 100k nested lists (would overflow the stack when dropped)
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat_n(b']', 100_000));
    deep.extend(std::iter::repeat_n(b'a', 99_999));
    deep.push(b'.');
    let f = pt_with_pickle(&dir, "deep.pt", deep, &[]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("deeper than"), "{e}");
    // exponential memo expansion ("billion laughs")
    let mut bomb = vec![0x80, 2, b']', b'q', 0];
    for i in 0..60u8 {
        bomb.extend([b'h', i, b'h', i, 0x86, b'q', i + 1]);
    }
    bomb.push(b'.');
    let f = pt_with_pickle(&dir, "bomb.pt", bomb, &[]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("more than"), "{e}");
    // an unknown opcode
    let f = pt_with_pickle(&dir, "op.pt", vec![0x80, 2, 0xff, b'.'], &[]);
    let e = err_of(Weights::load(&f));
    assert!(e.contains("op.pt") && e.contains("corrupt pickle"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The official trainer's BCCD result (`bccd-official-best.pt`) as fp16 inference weights, the
/// form weights/README.md documents: inference graph, nc=3, provenance of the source, exactly the
/// source's mapped tensors, and reproducible (converting twice gives the same bytes).
#[test]
fn official_bccd_checkpoint_converts_to_reproducible_f16_inference_weights() {
    let dir = tmpdir("ship");
    let convert_to = |name: &str| {
        let out = dir.join(name);
        convert::convert_file(
            &common::reference("bccd-official-best.pt"),
            &out,
            ConvertOptions {
                half: true,
                infer: true,
                ..Default::default()
            },
        )
        .unwrap();
        out
    };
    let first = convert_to("first.safetensors");
    let (w, prov) = Weights::load_with_provenance(&first).unwrap();
    assert_eq!(w.meta.graph, Graph::Infer);
    assert_eq!(w.meta.names, vec!["RBC", "WBC", "Platelets"]);
    assert_eq!(w.meta.strides, vec![8, 16, 32]);
    let prov = prov.expect("provenance in metadata");
    assert_eq!(prov.file, "bccd-official-best.pt");
    assert_eq!(
        prov.sha256,
        "85bf540acea44420e7539839512e0e2156d91a7af40d6aa722be4e8f7c70a606"
    );
    let src = Weights::load(common::reference("bccd-official-best.pt"))
        .unwrap()
        .to_infer()
        .unwrap();
    assert_same_tensors(&w, &src);
    assert_eq!(w.parameter_count(), 7_226_208 - 6 / 2 * 77 * 129);
    let size = std::fs::metadata(&first).unwrap().len();
    assert!((14_000_000..15_000_000).contains(&size), "{size} bytes");
    let again = convert_to("again.safetensors");
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&first).unwrap());
    let _ = std::fs::remove_dir_all(dir);
}

/// The shipped default weights (`weights/yolov9-s-bccd.safetensors`, see weights/README.md):
/// yolo9's own BCCD training run, fp16 inference graph with nc/names metadata, well under 20 MB.
/// (Their accuracy on the test split: `val_metrics::shipped_weights_reach_the_acceptance_map`.)
#[test]
fn shipped_weights_are_f16_inference_weights_with_class_names() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let (w, prov) = Weights::load_with_provenance(&shipped).unwrap();
    assert_eq!(w.meta.graph, Graph::Infer);
    assert_eq!(w.meta.nc, 3);
    assert_eq!(w.meta.names, vec!["RBC", "WBC", "Platelets"]);
    assert_eq!(w.meta.strides, vec![8, 16, 32]);
    assert_eq!(prov.expect("provenance").file, "best.safetensors");
    assert_eq!(w.parameter_count(), 7_226_208 - 6 / 2 * 77 * 129);
    let raw = candle_core::safetensors::load(&shipped, &candle_core::Device::Cpu).unwrap();
    assert!(raw
        .values()
        .all(|t| matches!(t.dtype(), DType::F16 | DType::I64)));
    let size = std::fs::metadata(&shipped).unwrap().len();
    assert!(size < 20_000_000, "{size} bytes");
}

/// `yolo9 convert` end to end: summary figures on stdout, and bad input → exit code 1 with one
/// `error:` line naming the file (no panic, no backtrace).
#[test]
fn cli_convert_summary_and_errors() {
    let exe = env!("CARGO_BIN_EXE_yolo9");
    let dir = tmpdir("cli");
    let out = dir.join("y.safetensors");
    let o = std::process::Command::new(exe)
        .args(["convert", "--infer", "-o"])
        .arg(&out)
        .arg(common::reference("yolov9-s.pt"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("imported:   1772 tensors"), "{stdout}");
    assert!(stdout.contains("1339 tensors, inference"), "{stdout}");
    assert!(stdout.contains("7226208 parameters, f32"), "{stdout}");
    assert!(stdout.contains("nc=80"), "{stdout}");
    let o = std::process::Command::new(exe)
        .args(["convert", "-o"])
        .arg(dir.join("t.safetensors"))
        .arg(common::reference("yolov9-s.pt"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("9804512 parameters, f32"), "{stdout}");
    assert!(stdout.contains("training"), "{stdout}");

    let bad = common::case("checkpoint_truncated").join("truncated_70pct.safetensors");
    let o = std::process::Command::new(exe)
        .args(["convert", "-o"])
        .arg(dir.join("z.safetensors"))
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("truncated_70pct"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.join("z.safetensors").exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// An unstripped training checkpoint holds both `model` and `ema`: `ema` wins when not None,
/// `model` otherwise (official `strip_optimizer` / `attempt_load` behaviour).
#[test]
fn ema_is_preferred_over_model() {
    let dir = tmpdir("ema");
    let sd = |p: &mut Pkl, key: &str| {
        p.op(b"}(").s("w");
        p.tensor("FloatStorage", key, 1, 0, &[1], &[1]);
        p.op(b"u");
    };
    let storages = [
        ("m", 1.0f32.to_le_bytes().to_vec()),
        ("e", 2.0f32.to_le_bytes().to_vec()),
    ];
    for (with_ema, want_key, want) in [(true, "ema", 2.0f32), (false, "model", 1.0)] {
        let mut p = Pkl::default();
        p.op(&[0x80, 2]).op(b"}(").s("model");
        sd(&mut p, "m");
        p.s("ema");
        if with_ema {
            sd(&mut p, "e");
        } else {
            p.op(b"N");
        }
        p.s("epoch").int(7).op(b"u.");
        let f = pt_with_pickle(&dir, &format!("ck-{with_ema}.pt"), p.0, &storages);
        let imp = convert::import_pt(&f).unwrap();
        assert_eq!(imp.source_key, want_key);
        assert_eq!(imp.tensors.len(), 1);
        assert_eq!(imp.tensors[0].0, "w");
        assert_eq!(imp.tensors[0].1.to_vec1::<f32>().unwrap(), vec![want]);
        assert!(
            imp.ignored.iter().any(|i| i.contains("epoch")),
            "{:?}",
            imp.ignored
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// One budget for a whole `.pt` load, checked before anything is inflated
/// (`yolo9::internals::pt::MAX_LOAD_BYTES`): a 16-byte storage viewed with stride 0 under a huge shape, and
/// four views of one large record, are refused at once (before: 4.2 GB and 5.2 GB of RSS).
#[test]
fn tensor_bytes_are_budgeted_before_reading() {
    let dir = tmpdir("budget");
    let mut p = Pkl::default();
    p.op(&[0x80, 2]).op(b"}(").s("model.0.conv.weight");
    p.tensor("FloatStorage", "0", 4, 0, &[1 << 16, 1 << 15], &[0, 0]);
    p.op(b"u.");
    let f = pt_with_pickle(&dir, "stride0.pt", p.0, &[("0", vec![0; 16])]);
    let t0 = std::time::Instant::now();
    let e = err_of(Weights::load(&f));
    assert!(
        e.contains("stride0.pt") && e.contains("2048 MB") && e.contains("model.0.conv.weight"),
        "{e}"
    );
    // Four 1 GiB views of one 1 GiB record (declared; the record itself is never read).
    let n = 1u64 << 28;
    let mut p = Pkl::default();
    p.op(&[0x80, 2]).op(b"}(");
    for i in 0..4 {
        p.s(&format!("model.{i}.conv.weight"));
        p.tensor("FloatStorage", "0", n, 0, &[n], &[1]);
    }
    p.op(b"u.");
    let f = pt_with_pickle(&dir, "views.pt", p.0, &[("0", vec![0; 16])]);
    let e = err_of(Weights::load(&f));
    assert!(
        e.contains("views.pt") && e.contains("would take more than"),
        "{e}"
    );
    assert!(t0.elapsed().as_secs_f64() < 5.0, "refused before reading");
    let _ = std::fs::remove_dir_all(dir);
}
