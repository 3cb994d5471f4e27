"""ONNX Runtime's static INT8 of yolo9's export, as `benches/ort_cpu.py` (speed) and
`benches/int8_accuracy.py` (accuracy) make it: `quantize_static`, QDQ, per-channel i8 weights,
u8 activations, MinMax calibration (the settings of yolo9's INT8), the head's last convolutions
and the decode left in f32 ([`decode_tail`]), as yolo9's INT8 leaves them."""
import os


def decode_tail(path):
    """Names of the nodes of `path` from which no convolution is reachable: the head's last
    convolutions and the decode after them (DFL, anchors, sigmoid, concatenation). Quantized, the
    concatenation of pixel boxes (0..640) and scores (0..1) on one u8 scale rounds every score to
    0: no detections."""
    import onnx

    nodes = list(onnx.load(path).graph.node)
    consumers = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    conv = {n.name: n.op_type == "Conv" for n in nodes}
    reaches = {}
    for n in reversed(nodes):  # ONNX nodes are in topological order
        reaches[n.name] = any(conv[c] or reaches.get(c, False)
                              for o in n.output for c in consumers.get(o, []))
    return [n.name for n in nodes if not reaches[n.name]]


def qdq_model(path, batches):
    """The path of the QDQ INT8 model of the export `path` (made once, beside it), calibrated on
    `batches` (a list of (B, 3, H, W) f32 arrays)."""
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    qdq = path.replace(".onnx", "-int8-qdq.onnx")
    if os.path.exists(qdq):
        return qdq
    name = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {name: x}

    pre = path.replace(".onnx", "-pre.onnx")
    quant_pre_process(path, pre)
    quantize_static(pre, qdq, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=decode_tail(pre))
    return qdq
