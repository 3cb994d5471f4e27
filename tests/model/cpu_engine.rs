//! The CPU engine (`yolo9::internals::model::cpu`) against the candle forward it replaces and the official
//! outputs: same values at every thread count, rectangular shapes and batches, and no new
//! arenas after the first call of a shape.

use crate::common;

use candle_core::{DType, Device, Tensor};
use yolo9::model::YoloV9;
use yolo9::Weights;

/// max |a − b| / max |b|.
fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    common::max_abs(a, b) / common::abs_max(b)
}

/// `a == b` bit for bit on the engine's own kernels; within 1e-5 of the largest value on the
/// `gemm` crate's (its blocking, and so the order of the sums, follows the tile sizes).
fn same_bits(kernel: &str, a: &Tensor, b: &Tensor, what: &str) {
    println!("kernel {kernel}");
    if kernel == "generic" {
        assert!(max_rel(a, b) <= 1e-5, "{what}: {}", max_rel(a, b));
    } else {
        assert_eq!(common::max_abs(a, b), 0.0, "{what}");
    }
}

/// The official forward of yolov9-s on horses.jpg (448x640): the engine's decoded output, on
/// 1 and 3 threads, equals `y_main` (boxes within 1e-2 px, scores within 1e-5) and the candle
/// forward; the thread count does not change a single bit.
#[test]
fn engine_matches_official_and_candle_forward() {
    let t = candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let w = Weights::load(common::reference("yolov9-s.pt")).unwrap();
    let x = &t["input"];
    let want = &t["y_main"];
    let m1 = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(1);
    let e1 = m1.cpu_engine().expect("the engine compiles yolov9-s");
    assert_eq!(e1.threads(), 1);
    let y1 = e1.forward(x).unwrap();
    assert_eq!(y1.dims(), want.dims());
    let eb = common::max_abs(&y1.narrow(1, 0, 4).unwrap(), &want.narrow(1, 0, 4).unwrap());
    let es = common::max_abs(
        &y1.narrow(1, 4, 80).unwrap(),
        &want.narrow(1, 4, 80).unwrap(),
    );
    println!("engine vs official y_main: box {eb:.2e} px, score {es:.2e}");
    assert!(eb <= 1e-2 && es <= 1e-5, "box {eb} score {es}");

    let candle = m1.forward_launched(x).unwrap();
    let r = max_rel(&y1, &candle);
    println!("engine vs candle forward: max abs err / absmax = {r:.2e}");
    assert!(r <= 1e-5, "{r}");

    let m3 = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(3);
    let y3 = m3.cpu_engine().unwrap().forward(x).unwrap();
    same_bits(e1.kernel(), &y1, &y3, "1 vs 3 threads");
    // YoloV9::forward on the CPU is the engine.
    assert_eq!(common::max_abs(&m3.forward(x).unwrap(), &y3), 0.0);
}

/// A batch of two different rectangular crops (224x320) of horses.jpg gives, per image, what
/// the candle forward gives (within 1e-4 of the output's largest value: another summation
/// order); repeated calls reuse one arena per shape.
#[test]
fn batches_and_shapes_reuse_their_arena() {
    let w = Weights::load(common::reference("yolov9-s-converted.pt")).unwrap();
    let m = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(2);
    let e = m.cpu_engine().unwrap();
    let t = candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let crop = |y: usize, x: usize| {
        t["input"]
            .narrow(2, y, 224)
            .unwrap()
            .narrow(3, x, 320)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    let (a, b) = (crop(0, 0), crop(224, 320));
    let x = Tensor::cat(&[&a, &b], 0).unwrap();
    let y = e.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 84, 28 * 40 + 14 * 20 + 7 * 10]);
    for (i, xi) in [&a, &b].into_iter().enumerate() {
        let want = m.forward_launched(xi).unwrap();
        let r = max_rel(&y.narrow(0, i, 1).unwrap(), &want);
        println!("image {i}: engine vs candle forward {r:.2e}");
        assert!(r <= 1e-4, "image {i}: {r}");
    }
    let (_, first) = e.stats();
    assert!(first <= 2, "{first} arenas for 2 images");
    for _ in 0..5 {
        e.forward(&x).unwrap();
    }
    e.forward(&a).unwrap();
    let (plans, arenas) = e.stats();
    // Batches run image by image through the plan of one image; no call after the first
    // allocates another arena.
    assert_eq!((plans, arenas), (1, first), "one plan, no new arena");
    // Images side by side (2 threads, 2 images) or one after another with every op over 8
    // threads (and the im2col convolution instead of the implicit one): the same bits.
    let m8 = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(8);
    same_bits(e.kernel(), &m8.forward(&x).unwrap(), &y, "2 vs 8 threads");
    assert!(e.arena_len(2, 224, 320).is_none());
    // Storages share space: the arena (activations and im2col scratch) holds less than half of
    // what the activations take one after another.
    let (arena, unshared) = e.arena_len(1, 224, 320).unwrap();
    println!("arena at 224x320: {arena} floats, unshared {unshared}");
    assert!(arena > 0 && 2 * arena < unshared, "{arena} vs {unshared}");
}

/// A shape that is not a multiple of 32 is refused with a message, not a panic.
#[test]
fn bad_shapes_are_errors() {
    let w = Weights::load(common::reference("yolov9-s-converted.pt")).unwrap();
    let m = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(1);
    let e = m.cpu_engine().unwrap();
    let x = Tensor::zeros((1, 3, 100, 64), DType::F32, &Device::Cpu).unwrap();
    let err = e.forward(&x).unwrap_err().to_string();
    assert!(err.contains("multiples of 32"), "{err}");
    let x = Tensor::zeros((1, 4, 64, 64), DType::F32, &Device::Cpu).unwrap();
    assert!(e
        .forward(&x)
        .unwrap_err()
        .to_string()
        .contains("4 channels"));
}
