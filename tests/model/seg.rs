//! Segmentation models (issue 53) against the official code: the state_dict of every official
//! segmentation graph (names, shapes, order, parameter count) and the eval forward of two small
//! graphs on seeded weights (`tests/model/seg_oracle/`, made by `benches/seg_oracle.py` with the
//! official `models/yolo.py`; see its docstring).

use crate::common;

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::sync::Arc;
use yolo9::internals::model::keys;
use yolo9::model::{Arch, YoloV9};

#[test]
fn every_segmentation_model_has_the_official_state_dict() {
    let text = std::fs::read_to_string(common::seg_oracle("official_keys.json")).unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    let all = all.as_object().unwrap();
    assert_eq!(all.len(), 5);
    for (name, want) in all {
        let arch = Arch::builtin(name).unwrap();
        assert!(arch.seg().is_some(), "{name}");
        let want = common::state_dict_entries_json(&want["keys"]);
        let ours = keys::state_dict_entries(&arch, 80).unwrap();
        assert_eq!(ours.len(), want.len(), "{name}: entries");
        for (i, (o, w)) in ours.iter().zip(&want).enumerate() {
            assert_eq!(o, w, "{name}: entry {i}");
        }
        let params: usize = ours
            .iter()
            .filter(|(n, _)| keys::is_parameter(n))
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        assert_eq!(
            params as u64,
            all[name]["parameters"].as_u64().unwrap(),
            "{name}: parameters (official summary)"
        );
    }
    // The released checkpoint's model: 27,634,720 parameters (the official README rounds to 27.4M
    // for a fused model).
    assert_eq!(all["gelan-c-seg"]["parameters"], 27_634_720);
}

/// max |a − b| over rows `from..from+n` of dim 1.
fn rows(a: &Tensor, b: &Tensor, from: usize, n: usize) -> f64 {
    common::max_abs(
        &a.narrow(1, from, n).unwrap(),
        &b.narrow(1, from, n).unwrap(),
    )
}

fn check_forward(name: &str) {
    let (w, t) = common::seg_oracle_weights(name);
    let m = YoloV9::load(&w, &Device::Cpu).unwrap();
    assert!(m.is_seg());
    let (pred, proto) = m.forward_seg(&t["x"]).unwrap();
    let want = &t["pred"];
    assert_eq!(pred.dims(), want.dims(), "{name}: pred shape");
    assert_eq!(proto.dims(), t["proto"].dims(), "{name}: proto shape");
    assert_eq!(pred.dims(), &[2, 4 + 3 + 8, 96 + 24 + 6]);
    assert_eq!(
        proto.dims(),
        &[2, 8, 16, 24],
        "{name}: prototypes at stride 4"
    );
    let boxes = rows(&pred, want, 0, 4);
    let scores = rows(&pred, want, 4, 3);
    let coeffs = rows(&pred, want, 7, 8) / common::abs_max(&want.narrow(1, 7, 8).unwrap());
    let protos = common::max_abs(&proto, &t["proto"]) / common::abs_max(&t["proto"]);
    println!("{name}: boxes {boxes:.2e} px, scores {scores:.2e}, coefficients rel {coeffs:.2e}, prototypes rel {protos:.2e}");
    assert!(boxes <= 1e-2, "{name}: boxes differ by {boxes:.2e} px");
    assert!(scores <= 1e-5, "{name}: scores differ by {scores:.2e}");
    assert!(coeffs <= 1e-4, "{name}: mask coefficients rel {coeffs:.2e}");
    assert!(protos <= 1e-4, "{name}: prototypes rel {protos:.2e}");
    // The detection-only forward (the CPU engine) of a segmentation model: the same boxes and
    // scores.
    let det = m.forward(&t["x"]).unwrap();
    assert_eq!(det.dims(), &[2, 7, 126]);
    assert!(rows(&det, want, 0, 4) <= 1e-2 && rows(&det, want, 4, 3) <= 1e-5);
    // forward_seg above ran on the CPU engine (its mask outputs); candle's ops give the same
    // to f32 rounding (another summation order).
    assert!(
        m.cpu_engine().is_some_and(|e| e.is_seg()),
        "{name}: no engine"
    );
    let (lp, lq) = m.forward_seg_launched(&t["x"]).unwrap();
    let rel = |a: &Tensor, b: &Tensor| common::max_abs(a, b) / common::abs_max(b);
    let (dp, dq) = (rel(&pred, &lp), rel(&proto, &lq));
    println!("{name}: engine vs candle ops: pred rel {dp:.2e}, prototypes rel {dq:.2e}");
    assert!(dp <= 1e-5 && dq <= 1e-5, "{name}: {dp:e} {dq:e}");
}

#[test]
fn segment_head_forward_equals_the_official_one() {
    check_forward("tiny-seg");
}

#[test]
fn dual_segment_training_weights_run_their_main_branch_as_the_official_forward() {
    check_forward("tiny-dseg");
    let (w, _) = common::seg_oracle_weights("tiny-dseg");
    let infer = w.to_infer().unwrap();
    let a = &infer.meta.arch;
    assert_eq!(a.name, "tiny-dseg-infer");
    assert_eq!(a.head().module_name(), "DSegment");
    // layers 0–21 and the main prototype branch 32–34, head 35 → 25.
    assert_eq!(a.layers.len(), 26);
    assert!(infer.tensors.contains_key("model.25.cv4.2.2.weight"));
    assert!(infer.tensors.contains_key("model.25.proto.conv.weight"));
    assert_eq!(
        infer.tensors["model.25.proto.conv.weight"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        w.tensors["model.35.proto2.conv.weight"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    );
}

#[test]
fn a_detection_model_has_no_masks() {
    let arch = Arc::new(Arch::builtin("gelan-t").unwrap());
    assert!(arch.seg().is_none());
    let e = keys::state_dict_entries(&arch, 3).unwrap();
    assert!(e.iter().all(|(n, _)| !n.contains("proto")));
}

#[test]
fn detector_masks_equal_the_official_predict() {
    // Image 0 of the oracle as an 8-bit image (its values are k/255), detected at its own size
    // (96x64: no resize, no padding), so that the official masks at input resolution are the
    // masks at original resolution.
    let (w, t) = common::seg_oracle_weights("tiny-seg");
    let x0 = (t["x"].get(0).unwrap() * 255.0).unwrap().round().unwrap();
    let hwc: Vec<f32> = x0
        .permute((1, 2, 0))
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let img = image::RgbImage::from_raw(96, 64, hwc.iter().map(|&v| v as u8).collect()).unwrap();
    let config = yolo9::DetectorConfig {
        img_size: 96,
        conf: 0.05,
        ..Default::default()
    };
    let det = yolo9::Detector::with_weights(&w, Device::Cpu, config).unwrap();
    assert!(det.is_seg());
    let dets = det.detect_rgb(&img).unwrap();
    let want = t["det0"].to_vec2::<f32>().unwrap();
    let masks = t["masks0"].to_vec3::<f32>().unwrap();
    assert_eq!(dets.len(), want.len());
    assert!(want.len() >= 5, "the oracle has detections to compare");
    let (mut differ, mut total) = (0usize, 0usize);
    for (d, (r, m)) in dets.iter().zip(want.iter().zip(&masks)) {
        assert_eq!(d.class_id, r[5] as usize);
        assert!((d.confidence - r[4]).abs() < 1e-5);
        for k in 0..4 {
            // Official boxes in input pixels, ours in original pixels: the same here.
            assert!((d.bbox[k] - r[k].clamp(0.0, [96.0, 64.0][k % 2])).abs() < 1e-3);
        }
        let mask = d
            .mask
            .as_ref()
            .expect("a segmentation detection has a mask");
        for y in 0..64u32 {
            for x in 0..96u32 {
                let theirs = m[y as usize][x as usize] > 0.5;
                total += theirs as usize;
                differ += (mask.contains(x, y) != theirs) as usize;
            }
        }
        if mask.area() > 0 {
            // The outline's points lie on the mask's window.
            for p in &mask.polygon {
                assert!(p[0] >= mask.x as f32 && p[0] <= (mask.x + mask.width) as f32);
                assert!(p[1] >= mask.y as f32 && p[1] <= (mask.y + mask.height) as f32);
            }
        }
    }
    println!("masks: {differ} of {total} official mask pixels differ");
    assert!(total > 500, "{total}");
    assert_eq!(
        differ, 0,
        "mask pixels differ from the official process_mask"
    );
}

#[test]
fn an_official_segmentation_checkpoint_converts_with_its_cfg() {
    // tiny-seg.pt: the official pickled model (f16), whose Segment head pickles
    // `getattr(Detect, 'forward')`; not a built-in model, so it is read as its --cfg.
    let (w, _) = common::seg_oracle_weights("tiny-seg");
    let (c, report) = common::tiny_seg_converted();
    assert_eq!(report.head, "Segment");
    assert_eq!(c.meta.names, ["a", "b", "c"]);
    // The counters (`num_batches_tracked`) come along; the oracle left them out.
    let floats = c.tensors.keys().filter(|k| !keys::is_counter(k)).count();
    assert_eq!(floats, w.tensors.len());
    for (k, t) in &w.tensors {
        let half = t
            .to_dtype(candle_core::DType::F16)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap();
        assert_eq!(common::max_abs(&c.tensors[k], &half), 0.0, "{k}");
    }
    // Without --cfg nothing built in fits: refused, naming the closest model and a tensor.
    let e = yolo9::convert::convert(&common::seg_oracle("tiny-seg.pt"), &Default::default())
        .unwrap_err();
    assert!(format!("{e:#}").contains("missing tensor"), "{e:#}");
}

/// The official segmentation loss on recorded head outputs (`{name}.loss.safetensors`).
fn check_loss(name: &str, dual: bool) {
    use yolo9::internals::loss::seg::{seg_loss, GtMasks, SegBranch};
    let t: HashMap<String, Tensor> = candle_core::safetensors::load(
        common::seg_oracle(&format!("{name}.loss.safetensors")),
        &Device::Cpu,
    )
    .unwrap();
    let levels =
        |b: &str| -> Vec<Tensor> { (3..6).map(|l| t[&format!("{b}_p{l}")].clone()).collect() };
    let aux_l = if dual { levels("aux") } else { Vec::new() };
    let main_l = levels("main");
    let cases: &[&str] = if dual {
        &["overlap"]
    } else {
        &["overlap", "instances"]
    };
    for (fused, case) in [false, true]
        .into_iter()
        .flat_map(|f| cases.iter().map(move |c| (f, c)))
    {
        let det = yolo9::internals::loss::DualTalLoss::new(3, &[8, 16, 32])
            .unwrap()
            .with_fused_terms(fused);
        let m = &t[&format!("{case}_masks")];
        let masks = if *case == "overlap" {
            GtMasks::Overlap(m)
        } else {
            GtMasks::PerTarget(m)
        };
        let aux = dual.then(|| SegBranch {
            levels: &aux_l,
            coeffs: &t["aux_coeffs"],
            proto: &t["aux_proto"],
        });
        let main = SegBranch {
            levels: &main_l,
            coeffs: &t["main_coeffs"],
            proto: &t["main_proto"],
        };
        let out = seg_loss(&det, aux, main, &t["targets"], masks, (64, 96)).unwrap();
        let want = t[&format!("{case}_items")].to_vec1::<f32>().unwrap();
        let total = t[&format!("{case}_total")].to_scalar::<f32>().unwrap();
        println!(
            "{name} {case} (fused terms {fused}): ours {:?} official {want:?}",
            out.items
        );
        for (k, (o, w)) in out.items.iter().zip(&want).enumerate() {
            let rel = (o - w).abs() / w.abs().max(1e-6);
            assert!(rel < 1e-4, "{name} {case}: item {k}: {o} vs {w}");
        }
        let ours = out.total.to_scalar::<f32>().unwrap();
        assert!(
            (ours - total).abs() / total < 1e-4,
            "{name} {case}: total {ours} vs {total}"
        );
    }
}

#[test]
fn segmentation_loss_equals_the_official_loss_tal() {
    check_loss("tiny-seg", false);
}

#[test]
fn dual_segmentation_loss_equals_the_official_loss_tal_dual() {
    check_loss("tiny-dseg", true);
}

#[test]
fn outlines_rasterise_as_the_official_polygon2mask() {
    use yolo9::internals::data::polygons::{overlap_mask, polygon_mask};
    let t: HashMap<String, Tensor> =
        candle_core::safetensors::load(common::seg_oracle("polygons.safetensors"), &Device::Cpu)
            .unwrap();
    let pts = t["points"].to_vec3::<f32>().unwrap();
    let counts = t["counts"].to_vec1::<f32>().unwrap();
    let m1 = t["mask1"].to_vec3::<f32>().unwrap();
    let m4 = t["mask4"].to_vec3::<f32>().unwrap();
    let outline = |i: usize| -> Vec<[f64; 2]> {
        pts[i][..counts[i] as usize]
            .iter()
            .map(|p| [f64::from(p[0]), f64::from(p[1])])
            .collect()
    };
    let flat = |m: &Vec<Vec<f32>>| -> Vec<u8> { m.iter().flatten().map(|&v| v as u8).collect() };
    let (mut differ1, mut differ4, mut total) = (0usize, 0usize, 0usize);
    for i in 0..pts.len() {
        let o = outline(i);
        let want1 = flat(&m1[i]);
        let got1 = polygon_mask(&o, 96, 64, 1);
        total += want1.iter().filter(|&&v| v != 0).count();
        differ1 += got1.iter().zip(&want1).filter(|(a, b)| a != b).count();
        let got4 = polygon_mask(&o, 96, 64, 4);
        differ4 += got4
            .iter()
            .zip(&flat(&m4[i]))
            .filter(|(a, b)| a != b)
            .count();
    }
    println!("outlines: {differ1} of {total} pixels differ at ratio 1, {differ4} at ratio 4");
    assert!(total > 1000);
    assert_eq!(
        (differ1, differ4),
        (0, 0),
        "cv2.fillPoly + cv2.resize pixels"
    );
    let outlines: Vec<Vec<[f64; 2]>> = (0..6).map(outline).collect();
    let (ov, order) = overlap_mask(&outlines, 96, 64, 4);
    let want_order: Vec<usize> = t["order"]
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as usize)
        .collect();
    assert_eq!(order, want_order);
    let want_ov: Vec<u32> = t["overlap4"]
        .to_vec2::<f32>()
        .unwrap()
        .iter()
        .flatten()
        .map(|&v| v as u32)
        .collect();
    assert_eq!(ov, want_ov, "polygons2masks_overlap");
}

#[test]
fn box_and_mask_metrics_equal_the_official_segment_val() {
    use yolo9::metrics::seg::SegValStats;
    let t: HashMap<String, Tensor> =
        candle_core::safetensors::load(common::seg_oracle("val_metrics.safetensors"), &Device::Cpu)
            .unwrap();
    let dets = t["dets"].to_vec2::<f32>().unwrap();
    let labels = t["labels"].to_vec2::<f32>().unwrap();
    let pm: Vec<u8> = t["pred_masks"]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as u8)
        .collect();
    let gm: Vec<f32> = t["gt_masks"].flatten_all().unwrap().to_vec1().unwrap();
    let nd = t["nd"].to_vec1::<f32>().unwrap();
    let nl = t["nl"].to_vec1::<f32>().unwrap();
    let px = 16 * 24;
    let mut stats = SegValStats::default();
    let (mut d0, mut l0) = (0usize, 0usize);
    for (i, (&n, &m)) in nd.iter().zip(&nl).enumerate() {
        let (n, m) = (n as usize, m as usize);
        let d: Vec<[f32; 6]> = dets[d0..d0 + n]
            .iter()
            .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5]])
            .collect();
        let l: Vec<[f32; 5]> = labels[l0..l0 + m]
            .iter()
            .map(|r| [r[0], r[1], r[2], r[3], r[4]])
            .collect();
        // The image's overlap mask → one mask per label (pixel value k + 1 is label k).
        let overlap = &gm[i * px..(i + 1) * px];
        let gt: Vec<u8> = (0..m)
            .flat_map(|k| overlap.iter().map(move |&v| u8::from(v == (k + 1) as f32)))
            .collect();
        stats.add_image(&d, &l, &pm[d0 * px..(d0 + n) * px], &gt, px);
        d0 += n;
        l0 += m;
    }
    let (b, mk) = stats.metrics(3);
    let ours = [
        b.mp,
        b.mr,
        b.map50,
        b.map50_95,
        mk.mp,
        mk.mr,
        mk.map50,
        mk.map50_95,
    ];
    let want = t["table"].to_vec1::<f64>().unwrap();
    println!("segment val: ours {ours:?}\n official {want:?}");
    assert!(want[4] > 0.3 && want[7] > 0.1, "the case has mask matches");
    for (k, (o, w)) in ours.iter().zip(&want).enumerate() {
        assert!((o - w).abs() < 1e-9, "value {k}: {o} vs {w}");
    }
}

/// The segmentation training graphs' taped forward and tape backward against candle's autograd,
/// through the segmentation loss: every parameter gradient, mask branches included.
#[test]
fn taped_segmentation_training_graph_backward_equals_candle_autograd() -> anyhow::Result<()> {
    use yolo9::internals::loss::seg::{seg_loss_of_raw, GtMasks};
    use yolo9::internals::loss::DualTalLoss;
    use yolo9::model::YoloV9Train;
    let dev = Device::Cpu;
    for name in ["tiny-seg", "tiny-dseg"] {
        let yaml = std::fs::read_to_string(common::seg_oracle(&format!("{name}.yaml")))?;
        let arch = Arch::from_yaml(&yaml, name)?;
        let l: HashMap<String, Tensor> = candle_core::safetensors::load(
            common::seg_oracle(&format!("{name}.loss.safetensors")),
            &dev,
        )?;
        let loss = DualTalLoss::new(3, &[8, 16, 32])?.with_fused_terms(false);
        let run = |raw: &yolo9::model::DualRaw| -> anyhow::Result<(Tensor, [f32; 4])> {
            let out = seg_loss_of_raw(
                &loss,
                raw,
                &l["targets"],
                GtMasks::Overlap(&l["overlap_masks"]),
                (64, 96),
            )?;
            Ok((out.total, out.items))
        };
        let plain = YoloV9Train::build(&arch, None, 3, Vec::new(), &dev, 5)?;
        let taped = YoloV9Train::build(&arch, None, 3, Vec::new(), &dev, 5)?;
        let (ta, ia) = run(&plain.forward(&l["x"], true)?)?;
        let ga = ta.backward()?;
        let (raw, tape) = taped.forward_taped(&l["x"])?;
        let (tb, ib) = run(&raw)?;
        let mut gb = tb.backward()?;
        let gb = tape.backward(&mut gb)?;
        assert_eq!(ia, ib, "{name}: loss items");
        assert!(ia[1] > 0.0, "{name}: a mask term");
        let (mut worst, mut mask_grads) = ((0f32, String::new()), 0);
        for (pa, pb) in plain.vars().iter().zip(taped.vars()) {
            assert_eq!(pa.name, pb.name);
            let (a, b) = match (ga.get(pa.var.as_tensor()), gb.get(pb.var.as_tensor())) {
                (Some(a), Some(b)) => (a, b),
                (None, None) => continue,
                (a, b) => panic!(
                    "{name} {}: gradient on one side only ({} / {})",
                    pa.name,
                    a.is_some(),
                    b.is_some()
                ),
            };
            if pa.name.contains(".proto") || pa.name.contains(".cv4.") || pa.name.contains(".cv7.")
            {
                mask_grads += 1;
            }
            let scale = a.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-12);
            let d = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()? / scale;
            if d > worst.0 {
                worst = (d, pa.name.clone());
            }
        }
        println!("{name}: loss {ia:?}; worst parameter gradient {:.2e} ({}); {mask_grads} mask-branch gradients", worst.0, worst.1);
        assert!(mask_grads >= 10, "{name}: the mask branch gets gradients");
        assert!(worst.0 < 1e-4, "{name}: {worst:?}");
    }
    Ok(())
}

/// `yolo9 train --cfg gelan-t-seg` on a dataset of box rows: each box trains as its four corners'
/// outline, and the run writes the mask loss column.
#[test]
fn the_cli_trains_a_named_segmentation_model_on_box_rows() {
    let dir = common::tmpdir("seg-train-boxes");
    let data = common::tiny_dataset(&dir, 2);
    let project = dir.join("runs");
    let (code, _, err) = common::yolo9(&[
        "train",
        "--data",
        data.to_str().unwrap(),
        "--cfg",
        "gelan-t-seg",
        "--img",
        "64",
        "--batch",
        "2",
        "--epochs",
        "1",
        "--workers",
        "1",
        "--noval",
        "--device",
        "cpu",
        "--project",
        project.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let csv = std::fs::read_to_string(project.join("exp/results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header.iter().position(|&c| c == "train/seg_loss").unwrap();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(row.len(), header.len());
    let seg: f32 = row[at].parse().unwrap();
    assert!(seg.is_finite() && seg > 0.0, "{seg}");
    let _ = std::fs::remove_dir_all(&dir);
}
