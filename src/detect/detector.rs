//! The public embeddable detector: weights in, `Vec<Detection>` per image out.
//!
//! Pipeline (official `detect_dual.py`): letterbox (`auto=True`, stride 32) → `(1,3,H,W)` f32
//! RGB / 255 → model (decoded main branch, `(B, 4+nc, A)`) → NMS → `scale_boxes` to original
//! pixels (clipped).
//!
//! ```no_run
//! use yolo9::{Detector, DetectorConfig};
//! let config = DetectorConfig { conf: 0.3, iou: 0.5, ..Default::default() };
//! let det = Detector::new("weights/yolov9-s-bccd.safetensors", candle_core::Device::Cpu, config)?;
//! for d in det.detect_file("a.jpg")? {
//!     println!("{} {:.2} {:?}", d.class_name, d.confidence, d.bbox);
//! }
//! # Ok::<(), yolo9::Error>(())
//! ```
use crate::detect::config::DetectorConfig;
use crate::detect::letterbox::{apply_letterbox, letterbox_info, to_tensor, LetterboxInfo, STRIDE};
use crate::detect::nms::{NmsOptions, Row};
use crate::detect::postprocess::{non_max_suppression, scale_rows};
use crate::error::Error;
use crate::model::weights::ModelMeta;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use image::{DynamicImage, RgbImage};
use std::path::Path;

/// One detected object, in original-image pixels.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Detection {
    /// Class index into the model's `names`.
    pub class_id: usize,
    /// Class name from the weights' metadata.
    pub class_name: String,
    /// Confidence in 0..1 (sigmoid class score of the chosen class).
    pub confidence: f32,
    /// Box `[x1, y1, x2, y2]` in original-image pixels, clipped to the image.
    pub bbox: [f32; 4],
    /// The instance mask, from a segmentation model ([`crate::detect::masks`]); `None` from a
    /// detection model (and in JSON then absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<crate::detect::masks::Mask>,
}

/// What the detector needs from a model: the decoded forward pass and the metadata.
/// Implemented by [`crate::model::yolov9::YoloV9`]; tests may plug in a fake.
pub trait InferenceModel: Send + Sync {
    /// `x`: `(B, 3, H, W)` f32 RGB 0..1, H and W multiples of 32 → `(B, 4+nc, A)` f32: rows
    /// `cx, cy, w, h` in input pixels, then sigmoid class scores.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Class names, strides, graph.
    fn meta(&self) -> &ModelMeta;
    /// (CUDA graphs captured, forwards replayed from them) so far (see
    /// [`crate::model::graphs`]); `(0, 0)` for a model that does not replay.
    fn graph_counts(&self) -> (usize, usize) {
        (0, 0)
    }
    /// Runs the network on `threads` CPU threads from now on (0: the default); a model without
    /// a thread setting ignores it.
    fn set_threads(&mut self, _threads: usize) {}
    /// A segmentation model's forward ([`crate::model::YoloV9::forward_seg`]): `(pred
    /// (B, 4+nc+nm, A), protos (B, nm, Hp, Wp))` f32; `None` for a detection model.
    fn forward_seg(&self, _x: &Tensor) -> Option<Result<(Tensor, Tensor)>> {
        None
    }
}

/// What the public methods return: [`crate::Error`], so that a service can match on the kind.
type Out<T> = std::result::Result<T, Error>;

/// The library's chains of context at the boundary (see [`Error::from`]).
fn out<T>(r: Result<T>) -> Out<T> {
    r.map_err(Error::from)
}

/// A loaded YOLOv9 model ready for inference. `Send + Sync`: share one `Arc<Detector>` between
/// threads; every call is independent.
pub struct Detector {
    model: Box<dyn InferenceModel>,
    device: Device,
    config: DetectorConfig,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detector")
            .field("device", &self.device)
            .field("config", &self.config)
            .field("names", &self.model.meta().names)
            .finish()
    }
}

impl Detector {
    /// Loads weights (yolo9 safetensors, plain state_dict safetensors or an official `.pt`; see
    /// [`crate::Weights::load`]) and builds the inference model on `device` with the options
    /// `config`, checked here once ([`DetectorConfig::validate`]); the network runs in
    /// [`DetectorConfig::dtype`].
    ///
    /// Errors: [`Error::Weights`] for a missing, unreadable or incompatible file (naming it and
    /// what is wrong), [`Error::InvalidOption`] for an option out of range,
    /// [`Error::OutOfMemory`] when the model does not fit on `device`.
    pub fn new(path: impl AsRef<Path>, device: Device, config: DetectorConfig) -> Out<Self> {
        let dtype = config.dtype(&device);
        Self::load_dtype(path, device, dtype)?.with_config(config)
    }

    /// [`Detector::new`] with the default options ([`DetectorConfig::default`]: 640 px, conf
    /// 0.25, IoU 0.45, max_det 1000, every class, per-class NMS, f32).
    pub fn load(path: impl AsRef<Path>, device: Device) -> Out<Self> {
        Self::new(path, device, DetectorConfig::default())
    }

    /// [`Detector::load`] running the network in `dtype` (f32, or f16/bf16 half precision; see
    /// [`crate::model::yolov9::YoloV9::load_dtype`]). Outputs, boxes and NMS stay f32.
    ///
    /// Errors: those of [`Detector::load`], or a non-float `dtype`.
    pub fn load_dtype(path: impl AsRef<Path>, device: Device, dtype: DType) -> Out<Self> {
        let path = path.as_ref();
        let weights = crate::model::weights::Weights::load(path)?;
        let model = out(load_model(&weights, &device, dtype)
            .with_context(|| format!("building the model from {}", crate::text::path(&path))))?;
        Ok(Self::from_boxed(model, device))
    }

    /// Builds the inference model of already loaded `weights` on `device` with the options
    /// `config` (as [`Detector::new`]; a training graph runs its main branch).
    ///
    /// Errors: an option out of range, or weights the model cannot be built from.
    pub fn with_weights(
        weights: &crate::model::weights::Weights,
        device: Device,
        config: DetectorConfig,
    ) -> Out<Self> {
        let model = out(load_model(weights, &device, config.dtype(&device)))?;
        Self::from_boxed(model, device).with_config(config)
    }

    /// Builds the inference model of already loaded `weights` on `device`, running in `dtype`,
    /// with the default options.
    ///
    /// Errors: a non-float `dtype`, or weights the model cannot be built from.
    pub fn from_weights(
        weights: &crate::model::weights::Weights,
        device: Device,
        dtype: DType,
    ) -> Out<Self> {
        let model = out(load_model(weights, &device, dtype))?;
        Ok(Self::from_boxed(model, device))
    }

    /// Wraps an already built model (e.g. a `YoloV9`, or a test double), with the default
    /// options.
    pub fn from_model(model: impl InferenceModel + 'static, device: Device) -> Self {
        Self::from_boxed(Box::new(model), device)
    }

    fn from_boxed(model: Box<dyn InferenceModel>, device: Device) -> Self {
        Self {
            model,
            device,
            config: DetectorConfig::default(),
        }
    }

    /// The same model with the options `config`, checked here once
    /// ([`DetectorConfig::validate`] against the model's classes). The network's precision was
    /// fixed when the model was built: `config.half` is not read here.
    ///
    /// Errors: [`Error::InvalidOption`] naming the option and its value.
    pub fn with_config(mut self, config: DetectorConfig) -> Out<Self> {
        config.validate(self.names().len())?;
        if config.threads != self.config.threads {
            self.model.set_threads(config.threads);
        }
        tracing::debug!(device = ?self.device.location(), ?config, "detector configured");
        self.config = config;
        Ok(self)
    }

    /// The options in use.
    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// Model metadata (class names, strides).
    pub fn meta(&self) -> &ModelMeta {
        self.model.meta()
    }
    /// Class names, `names()[class_id]`.
    pub fn names(&self) -> &[String] {
        &self.model.meta().names
    }
    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The effective inference size (multiple of 32).
    pub fn effective_img_size(&self) -> Out<u32> {
        self.config.effective_img_size()
    }
    /// The inference size of the options (before rounding to a multiple of 32).
    pub fn requested_img_size(&self) -> u32 {
        self.config.img_size
    }
    /// The NMS options in use ([`DetectorConfig::nms`]).
    pub fn nms_options(&self) -> NmsOptions {
        self.config.nms()
    }

    /// Checks the options of one call ([`Detector::detect_batch_with`]) as
    /// [`Detector::with_config`] checks the detector's own.
    fn validate_call(&self, img_size: u32, o: &NmsOptions) -> Out<()> {
        DetectorConfig {
            img_size,
            conf: o.conf_thres,
            iou: o.iou_thres,
            max_det: o.max_det,
            classes: o.classes.clone(),
            agnostic: o.agnostic,
            multi_label: o.multi_label,
            ..DetectorConfig::default()
        }
        .validate(self.names().len())
    }

    /// Step 1: letterbox an upright RGB image. Returns the network-input image and its geometry.
    pub fn preprocess(&self, img: &RgbImage) -> Out<(RgbImage, LetterboxInfo)> {
        out(self.preprocess_at(img, self.config.img_size))
    }

    /// [`Detector::preprocess`] at another inference size (rounded up to a multiple of 32).
    fn preprocess_at(&self, img: &RgbImage, img_size: u32) -> Result<(RgbImage, LetterboxInfo)> {
        let info = letterbox_geometry(img.width(), img.height(), img_size)?;
        Ok((apply_letterbox(img, &info), info))
    }

    /// Step 2: the forward pass on same-sized letterboxed images; `(B, 4+nc, A)` f32, left on
    /// the detector's device (step 3 copies only the NMS candidates to the host). The device is
    /// synchronized before returning, so the call's wall time is the forward's.
    pub fn infer(&self, letterboxed: &[&RgbImage]) -> Out<Tensor> {
        out(self.infer_padded(letterboxed, 0))
    }

    /// [`Detector::infer`] with the input padded on the device to `pad_to` images (copies of the
    /// first) when there are fewer; the output keeps only the real images' rows.
    fn infer_padded(&self, letterboxed: &[&RgbImage], pad_to: usize) -> Result<Tensor> {
        let mut x = to_tensor(letterboxed, &self.device)?;
        let n = letterboxed.len();
        if pad_to > n && n > 0 {
            let extra = x.narrow(0, 0, 1)?.repeat((pad_to - n, 1, 1, 1))?;
            x = Tensor::cat(&[&x, &extra], 0)?;
        }
        let y = self.forward_on_device(&x)?;
        let y = if pad_to > n { y.narrow(0, 0, n)? } else { y };
        let nc = self.names().len();
        let (b, rows, _) = y
            .dims3()
            .with_context(|| format!("model output has shape {:?}", y.shape()))?;
        if b != letterboxed.len() || rows != 4 + nc {
            bail!(
                "model output has shape {:?}, expected ({}, {}, A) for {nc} classes",
                y.shape(),
                letterboxed.len(),
                4 + nc
            );
        }
        let y = y.to_dtype(DType::F32)?;
        self.device.synchronize()?;
        Ok(y)
    }

    /// Whether the model segments (its detections carry masks: [`Detection::mask`]).
    pub fn is_seg(&self) -> bool {
        self.meta().arch.seg().is_some()
    }

    /// Detections with masks of same-sized letterboxed images of a segmentation model: the
    /// forward ([`InferenceModel::forward_seg`]), the official NMS on the box and class rows
    /// (the coefficient rows ride along with each kept anchor, as `non_max_suppression(...,
    /// nm=32)` carries them), boxes scaled to each image (`infos[b]`), and each detection's
    /// mask ([`crate::detect::masks::instance_mask`]).
    ///
    /// Errors: a detection model, a failed forward, outputs of the wrong shape.
    pub fn segment(
        &self,
        letterboxed: &[&RgbImage],
        infos: &[LetterboxInfo],
        nms: &NmsOptions,
    ) -> Out<Vec<Vec<Detection>>> {
        out((|| -> Result<Vec<Vec<Detection>>> {
            use crate::detect::masks::{instance_mask, Protos};
            let x = to_tensor(letterboxed, &self.device)?;
            let (pred, proto) = self
                .model
                .forward_seg(&x)
                .context("the model has no masks")?
                .context("model forward")?;
            let nc = self.names().len();
            let (b, rows, a) = pred.dims3()?;
            let (pb, nm, ph, pw) = proto.dims4()?;
            if b != letterboxed.len() || b != infos.len() || pb != b || rows != 4 + nc + nm {
                bail!(
                    "segmentation output {:?} / prototypes {:?} do not fit {} images of {nc} classes",
                    pred.shape(),
                    proto.shape(),
                    letterboxed.len()
                );
            }
            let pred = pred.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
            let proto = proto.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
            let mut all = Vec::with_capacity(b);
            for (i, info) in infos.iter().enumerate() {
                let p: Vec<f32> = pred.get(i)?.flatten_all()?.to_vec1()?;
                let q: Vec<f32> = proto.get(i)?.flatten_all()?.to_vec1()?;
                let kept =
                    crate::detect::nms::nms_image_anchored(&p[..(4 + nc) * a], nc, a, nms, false);
                let mut scaled: Vec<Row> = kept
                    .iter()
                    .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5]])
                    .collect();
                scale_rows(&mut scaled, info);
                let mut dets = self.to_detections(&scaled);
                for ((d, k), r) in dets.iter_mut().zip(&kept).zip(&scaled) {
                    let anchor = k[6] as usize;
                    let coeffs: Vec<f32> = (0..nm).map(|m| p[(4 + nc + m) * a + anchor]).collect();
                    let protos = Protos {
                        data: &q,
                        nm,
                        h: ph,
                        w: pw,
                    };
                    d.mask = Some(instance_mask(
                        protos,
                        &coeffs,
                        [k[0], k[1], k[2], k[3]],
                        [r[0], r[1], r[2], r[3]],
                        info,
                    ));
                }
                all.push(dets);
            }
            Ok(all)
        })())
    }

    /// (CUDA graphs captured, forwards replayed from them) by this detector's model so far.
    pub fn graph_counts(&self) -> (usize, usize) {
        self.model.graph_counts()
    }

    /// The forward pass on a prepared input `x` `(B, 3, H, W)` f32 RGB 0..1 (H, W multiples of
    /// 32, any device) → `(B, 4+nc, A)` f32 left on the detector's device (what
    /// [`Detector::postprocess`] takes), the device synchronized before returning.
    pub fn infer_tensor(&self, x: &Tensor) -> Out<Tensor> {
        out((|| -> Result<Tensor> {
            let x = x.to_device(&self.device)?;
            let y = self.forward_on_device(&x)?.to_dtype(DType::F32)?;
            self.device.synchronize()?;
            Ok(y)
        })())
    }

    /// The raw forward pass on a prepared input `x` `(B, 3, H, W)` f32 RGB 0..1 (H, W multiples
    /// of 32) → `(B, 4+nc, A)` f32 on the CPU. For callers that letterbox themselves.
    pub fn forward_tensor(&self, x: &Tensor) -> Out<Tensor> {
        out((|| -> Result<Tensor> {
            let y = self.forward_on_device(x)?;
            Ok(y.to_dtype(DType::F32)?.to_device(&Device::Cpu)?)
        })())
    }

    /// The model forward ([`InferenceModel::forward`]; on the CPU it picks its threads itself).
    fn forward_on_device(&self, x: &Tensor) -> Result<Tensor> {
        self.model.forward(x).context("model forward")
    }

    /// Step 3: NMS on a `(B, 4+nc, A)` output (any device; see [`crate::detect::postprocess::host_candidates`]) and scaling
    /// to original pixels (`infos[b]`).
    pub fn postprocess(&self, pred: &Tensor, infos: &[LetterboxInfo]) -> Out<Vec<Vec<Detection>>> {
        out(self.postprocess_with(pred, infos, &self.config.nms()))
    }

    fn postprocess_with(
        &self,
        pred: &Tensor,
        infos: &[LetterboxInfo],
        nms: &NmsOptions,
    ) -> Result<Vec<Vec<Detection>>> {
        let (b, rows, _) = pred.dims3()?;
        if b != infos.len() || rows < 5 {
            bail!(
                "postprocess: output {:?} does not match {} images",
                pred.shape(),
                infos.len()
            );
        }
        Ok(self
            .rows_of(pred, infos, nms)?
            .iter()
            .map(|det| self.to_detections(det))
            .collect())
    }

    /// Rows `[x1, y1, x2, y2, conf, cls]` → [`Detection`]s with class names.
    pub fn to_detections(&self, rows: &[Row]) -> Vec<Detection> {
        let names = self.names();
        rows.iter()
            .map(|r| {
                let c = r[5] as usize;
                Detection {
                    class_id: c,
                    class_name: names.get(c).cloned().unwrap_or_else(|| format!("class{c}")),
                    confidence: r[4],
                    bbox: [r[0], r[1], r[2], r[3]],
                    mask: None,
                }
            })
            .collect()
    }

    /// Detects objects in the image file `path`, decoded as `yolo9 detect` decodes it (EXIF
    /// orientation applied, colour modes converted, size limits checked; see
    /// [`crate::data::image::load_rgb8`]). Boxes are in the file's upright pixels.
    ///
    /// Errors: [`Error::Image`] naming the file when it cannot be read or decoded,
    /// [`Error::InvalidOption`] for options out of range, [`Error::OutOfMemory`].
    pub fn detect_file(&self, path: impl AsRef<Path>) -> Out<Vec<Detection>> {
        let path = path.as_ref();
        let img = crate::data::image::load_rgb8(path).map_err(|e| Error::image(path, &e))?;
        self.detect_rgb(&img)
    }

    /// Detects objects in an upright RGB image; boxes in its pixels. With tiles
    /// ([`DetectorConfig::tile`]) the image is detected tile by tile ([`Detector::detect_tiled`]).
    pub fn detect_rgb(&self, img: &RgbImage) -> Out<Vec<Detection>> {
        if self.config.tile.on() {
            return self.detect_tiled(img, &self.config.tile);
        }
        out((|| -> Result<Vec<Detection>> {
            let (lb, info) = self.preprocess(img)?;
            if self.is_seg() {
                let nms = self.config.nms();
                return Ok(self
                    .segment(&[&lb], &[info], &nms)?
                    .pop()
                    .unwrap_or_default());
            }
            let y = self.infer(&[&lb])?;
            Ok(self.postprocess(&y, &[info])?.pop().unwrap_or_default())
        })())
    }

    /// Detects objects in `img` (any colour mode; converted by the rule of
    /// [`crate::data::image`]: grey replicated, alpha dropped, 16-bit / 257). The image is used
    /// as given: decode files with [`crate::data::image::load_rgb8`] to apply EXIF orientation.
    /// Boxes are in `img` pixels.
    pub fn detect(&self, img: &DynamicImage) -> Out<Vec<Detection>> {
        self.detect_rgb(&rgb_of(img))
    }

    /// Detects objects in several images. Images whose letterboxes have the same size run as one
    /// batch; results are identical to calling [`Detector::detect`] on each, in input order.
    pub fn detect_batch(&self, imgs: &[DynamicImage]) -> Out<Vec<Vec<Detection>>> {
        self.detect_batch_with(imgs, self.config.img_size, &self.config.nms())
    }

    /// [`Detector::detect_batch`] with another inference size and NMS options than the
    /// detector's own, for one call (a service's per-request parameters). Equal to a detector
    /// built with these options ([`Detector::with_config`]).
    ///
    /// Errors: options out of range (as when detecting with them), a failed forward.
    pub fn detect_batch_with(
        &self,
        imgs: &[DynamicImage],
        img_size: u32,
        nms: &NmsOptions,
    ) -> Out<Vec<Vec<Detection>>> {
        self.detect_batch_padded(imgs, img_size, nms, 0)
    }

    /// [`Detector::detect_batch_with`] with every forward's input padded on the device to
    /// `pad_to` images (copies of the group's first; their outputs are dropped), so that
    /// batches of varying size share one input shape, and so one CUDA graph
    /// ([`crate::model::graphs`]). The detections are those of the unpadded call.
    ///
    /// Errors: as [`Detector::detect_batch_with`].
    pub fn detect_batch_padded(
        &self,
        imgs: &[DynamicImage],
        img_size: u32,
        nms: &NmsOptions,
        pad_to: usize,
    ) -> Out<Vec<Vec<Detection>>> {
        out((|| -> Result<Vec<Vec<Detection>>> {
            self.validate_call(img_size, nms)?;
            if self.config.tile.on() {
                return imgs
                    .iter()
                    .enumerate()
                    .map(|(i, img)| {
                        self.tiled_detections(&rgb_of(img), img_size, nms, &self.config.tile)
                            .with_context(|| format!("image {i} of the batch"))
                    })
                    .collect();
            }
            let mut prepared = Vec::with_capacity(imgs.len());
            for (i, img) in imgs.iter().enumerate() {
                let p = self
                    .preprocess_at(&rgb_of(img), img_size)
                    .with_context(|| format!("image {i} of the batch"))?;
                prepared.push(p);
            }
            self.detect_letterboxed(&prepared, nms, pad_to)
        })())
    }

    /// [`Detector::detect_batch_padded`] of images already letterboxed at the call's inference
    /// size ([`letterbox_geometry`], then [`apply_letterbox`]; a service letterboxes on its decode
    /// threads, in parallel, and hands the detector only the forward): one forward per letterbox
    /// shape, each padded to `pad_to` images. Equal to `detect_batch_padded` of the original images. Ignores the
    /// detector's tiling (the caller tiles, or calls `detect_batch_padded`).
    ///
    /// Errors: a failed forward.
    pub(crate) fn detect_letterboxed(
        &self,
        prepared: &[(RgbImage, LetterboxInfo)],
        nms: &NmsOptions,
        pad_to: usize,
    ) -> Result<Vec<Vec<Detection>>> {
        let n = prepared.len();
        let mut out: Vec<Vec<Detection>> = vec![Vec::new(); n];
        let mut done = vec![false; n];
        for i in 0..n {
            if done[i] {
                continue;
            }
            let dims = prepared[i].0.dimensions();
            let group: Vec<usize> = (i..n)
                .filter(|&j| !done[j] && prepared[j].0.dimensions() == dims)
                .collect();
            let lbs: Vec<&RgbImage> = group.iter().map(|&j| &prepared[j].0).collect();
            let infos: Vec<LetterboxInfo> = group.iter().map(|&j| prepared[j].1).collect();
            let dets = if self.is_seg() {
                self.segment(&lbs, &infos, nms)?
            } else {
                let y = self.infer_padded(&lbs, pad_to)?;
                self.postprocess_with(&y, &infos, nms)?
            };
            for (k, dets) in dets.into_iter().enumerate() {
                out[group[k]] = dets;
                done[group[k]] = true;
            }
        }
        Ok(out)
    }
}

/// Tiles per forward of a tiled image: every tile of an image shares one input shape; the GPU
/// takes this many at once, the CPU (whose forward gains little from a batch) fewer.
const TILE_BATCH_GPU: usize = 16;
const TILE_BATCH_CPU: usize = 4;

impl Detector {
    /// Sliced inference ([`crate::detect::tile`]) of an upright RGB image with the options
    /// `tile` (whatever [`DetectorConfig::tile`] says): the tiles of [`crate::detect::tile::grid`]
    /// letterboxed to the detector's inference size and detected in batches, the whole image
    /// too when `tile.full_image`, their detections merged ([`crate::detect::tile::merge`]).
    /// Boxes in the image's pixels. An image no larger than a tile is detected as
    /// [`Detector::detect_rgb`] without tiles detects it.
    ///
    /// Errors: [`Error::InvalidOption`] for tile options out of range; a failed forward.
    pub fn detect_tiled(
        &self,
        img: &RgbImage,
        tile: &crate::detect::tile::TileOptions,
    ) -> Out<Vec<Detection>> {
        out((|| -> Result<Vec<Detection>> {
            tile.validate().map_err(Error::InvalidOption)?;
            self.tiled_detections(img, self.config.img_size, &self.config.nms(), tile)
        })())
    }

    /// The detections of [`Detector::detect_tiled`] at `img_size` with the NMS options `nms`
    /// (each tile's NMS, then the merge at `nms.iou_thres` and `nms.max_det`). A segmentation
    /// model's detections carry masks: each tile's, moved into the image's pixels, and for a box
    /// joined from pieces of several tiles the union of the pieces' masks inside it
    /// ([`crate::detect::masks::Mask::union`]).
    fn tiled_detections(
        &self,
        img: &RgbImage,
        img_size: u32,
        nms: &NmsOptions,
        tile: &crate::detect::tile::TileOptions,
    ) -> Result<Vec<Detection>> {
        use crate::detect::masks::Mask;
        use crate::detect::tile::{cut_sides, grid, merge_groups, Piece};
        let (w, h) = img.dimensions();
        let rects = grid(w, h, tile.size, tile.overlap);
        if rects.len() <= 1 {
            return self.whole_detections(img, img_size, nms);
        }
        // A box within 0.5 % of the tile size (at least 2 px) of an inner border is cut.
        let margin = (tile.size as f32 * 0.005).max(2.0);
        let per_forward = if self.device.is_cpu() {
            TILE_BATCH_CPU
        } else {
            TILE_BATCH_GPU
        };
        let mut pieces = Vec::new();
        let mut masks: Vec<Option<Mask>> = Vec::new();
        for (c, chunk) in rects.chunks(per_forward).enumerate() {
            let mut prepared = Vec::with_capacity(chunk.len());
            for r in chunk {
                let crop =
                    image::imageops::crop_imm(img, r[0], r[1], r[2] - r[0], r[3] - r[1]).to_image();
                prepared.push(self.preprocess_at(&crop, img_size)?);
            }
            let lbs: Vec<&RgbImage> = prepared.iter().map(|p| &p.0).collect();
            let infos: Vec<LetterboxInfo> = prepared.iter().map(|p| p.1).collect();
            for (k, found) in self
                .rows_and_masks(&lbs, &infos, nms)?
                .into_iter()
                .enumerate()
            {
                let r = chunk[k];
                for (mut row, mask) in found {
                    row[0] += r[0] as f32;
                    row[1] += r[1] as f32;
                    row[2] += r[0] as f32;
                    row[3] += r[1] as f32;
                    let b = [row[0], row[1], row[2], row[3]];
                    pieces.push(Piece {
                        row,
                        tile: c * per_forward + k,
                        seen: r.map(|v| v as f32),
                        cut: cut_sides(b, r, (w, h), margin),
                    });
                    masks.push(mask.map(|m| m.shifted(r[0], r[1])));
                }
            }
        }
        if tile.full_image {
            // An object no longer than the overlap lies whole in some tile, seen there at full
            // resolution: the whole-image pass adds only the larger ones.
            let ov = tile.size as f32 * tile.overlap;
            let (lb, info) = self.preprocess_at(img, img_size)?;
            let found = self.rows_and_masks(&[&lb], &[info], nms)?;
            for (row, mask) in found.into_iter().flatten() {
                if row[2] - row[0] <= ov && row[3] - row[1] <= ov {
                    continue;
                }
                pieces.push(Piece::whole(
                    row,
                    usize::MAX,
                    [0.0, 0.0, w as f32, h as f32],
                ));
                masks.push(mask);
            }
        }
        let groups = merge_groups(
            &pieces,
            nms.iou_thres,
            tile.match_thresh,
            nms.agnostic,
            nms.max_det,
        );
        let rows: Vec<Row> = groups.iter().map(|g| g.0).collect();
        let mut dets = self.to_detections(&rows);
        if self.is_seg() {
            for (d, (row, members)) in dets.iter_mut().zip(&groups) {
                d.mask = match members.as_slice() {
                    [one] => masks[*one].take(),
                    _ => {
                        let parts: Vec<&Mask> =
                            members.iter().filter_map(|&i| masks[i].as_ref()).collect();
                        Some(Mask::union(
                            &parts,
                            [row[0], row[1], row[2], row[3]],
                            (w, h),
                        ))
                    }
                };
            }
        }
        Ok(dets)
    }

    /// The detections of `img` detected whole: letterboxed at `img_size`, one forward, `nms`,
    /// in the image's pixels (with masks from a segmentation model).
    fn whole_detections(
        &self,
        img: &RgbImage,
        img_size: u32,
        nms: &NmsOptions,
    ) -> Result<Vec<Detection>> {
        let (lb, info) = self.preprocess_at(img, img_size)?;
        if self.is_seg() {
            return Ok(self
                .segment(&[&lb], &[info], nms)?
                .pop()
                .unwrap_or_default());
        }
        let y = self.infer_padded(&[&lb], 0)?;
        let rows = self.rows_of(&y, &[info], nms)?.pop().unwrap_or_default();
        Ok(self.to_detections(&rows))
    }

    /// The detections of same-sized letterboxed images as rows `[x1, y1, x2, y2, conf, cls]`
    /// in each image's pixels, each with its mask from a segmentation model (`None` from a
    /// detection model).
    #[allow(clippy::type_complexity)]
    fn rows_and_masks(
        &self,
        letterboxed: &[&RgbImage],
        infos: &[LetterboxInfo],
        nms: &NmsOptions,
    ) -> Result<Vec<Vec<(Row, Option<crate::detect::masks::Mask>)>>> {
        if self.is_seg() {
            let dets = self.segment(letterboxed, infos, nms)?;
            return Ok(dets
                .into_iter()
                .map(|image| {
                    image
                        .into_iter()
                        .map(|d| {
                            let [x1, y1, x2, y2] = d.bbox;
                            ([x1, y1, x2, y2, d.confidence, d.class_id as f32], d.mask)
                        })
                        .collect()
                })
                .collect());
        }
        let y = self.infer_padded(letterboxed, 0)?;
        Ok(self
            .rows_of(&y, infos, nms)?
            .into_iter()
            .map(|rows| rows.into_iter().map(|r| (r, None)).collect())
            .collect())
    }

    /// NMS of an output `(B, 4+nc, A)` with `nms`, scaled to each image's pixels (`infos[b]`).
    fn rows_of(
        &self,
        pred: &Tensor,
        infos: &[LetterboxInfo],
        nms: &NmsOptions,
    ) -> Result<Vec<Vec<Row>>> {
        let mut all = non_max_suppression(pred, nms)?;
        for (det, info) in all.iter_mut().zip(infos) {
            scale_rows(det, info);
        }
        Ok(all)
    }
}

impl InferenceModel for crate::model::yolov9::YoloV9 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::model::yolov9::YoloV9::forward(self, x)
    }
    fn meta(&self) -> &ModelMeta {
        crate::model::yolov9::YoloV9::meta(self)
    }
    fn graph_counts(&self) -> (usize, usize) {
        crate::model::yolov9::YoloV9::graph_counts(self)
    }
    fn set_threads(&mut self, threads: usize) {
        self.set_threads(threads);
    }
    fn forward_seg(&self, x: &Tensor) -> Option<Result<(Tensor, Tensor)>> {
        self.is_seg()
            .then(|| crate::model::yolov9::YoloV9::forward_seg(self, x))
    }
}

/// Builds the inference model (`YoloV9`, BN folded, RepConvN fused) from weights of either graph.
fn load_model(
    weights: &crate::model::weights::Weights,
    device: &Device,
    dtype: DType,
) -> Result<Box<dyn InferenceModel>> {
    Ok(Box::new(crate::model::yolov9::YoloV9::load_dtype(
        weights, device, dtype,
    )?))
}

/// The letterbox geometry (official `letterbox(auto=True)`, stride 32) of a `w` x `h` image at
/// inference size `img_size` (rounded up to a multiple of 32), as [`Detector::preprocess`] uses
/// it; [`apply_letterbox`] makes the image. A service computes it first to hold the letterboxed
/// image's bytes (`3 * out_w * out_h`) in its memory budget before making it.
///
/// Errors: an inference size out of range, an empty image.
pub(crate) fn letterbox_geometry(w: u32, h: u32, img_size: u32) -> Result<LetterboxInfo> {
    let s = crate::detect::config::effective_img_size(img_size)?;
    letterbox_info(w, h, s, s, STRIDE, true)
}

/// `img` as 8-bit RGB: borrowed when it is, else converted by the rule of
/// [`crate::data::image::to_rgb8`] (grey replicated, alpha dropped, 16-bit / 257).
fn rgb_of(img: &DynamicImage) -> std::borrow::Cow<'_, RgbImage> {
    match img.as_rgb8() {
        Some(rgb) => std::borrow::Cow::Borrowed(rgb),
        None => std::borrow::Cow::Owned(crate::data::image::to_rgb8(img.clone())),
    }
}
