"""The Tinker wire formats the service reads and writes besides JSON: the protobuf
``ForwardBackwardRequest`` the client sends (zstd-compressed when it says so), and the
protobuf ``ForwardBackwardOutput`` and ``SampleResponse`` it reads back. The message
classes are the client's own (``tinker.proto``), so both ends share one schema.

Every problem with a request is an :class:`EndpointError` (400) naming the datum and the
field, raised before any work is queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from streamrl.stream.endpoint.openai_format import EndpointError

_DTYPES = {
    pb.DTYPE_FLOAT32: np.dtype(np.float32),
    pb.DTYPE_INT64: np.dtype(np.int64),
    pb.DTYPE_INT32: np.dtype(np.int32),
}
# what each known input holds; any other name is passed to the loss as float32
_INTEGER_INPUTS = {"target_tokens"}
MAX_DECOMPRESSED = 1 << 30


@dataclass
class Datum:
    """One sequence: ``tokens`` (N,) int64 and its per-position ``inputs`` (N,) each."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    data: list[Datum]
    forward_only: bool


def decode_forward_backward(raw: bytes, content_encoding: str | None) -> ForwardBackward:
    """The request's fields and datums, checked: every input has one value per position."""
    if content_encoding not in (None, "", "identity", "zstd"):
        raise EndpointError(415, f"Content-Encoding {content_encoding!r}: only zstd is read")
    if content_encoding == "zstd":
        raw = _unzstd(raw)
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(raw)
    except DecodeError as e:
        raise EndpointError(400, f"body: not a ForwardBackwardRequest protobuf ({e})") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = [_datum(i, d) for i, d in enumerate(msg.data)]
    if not data:
        raise EndpointError(400, "data: no datum")
    return ForwardBackward(
        msg.model_id, msg.seq_id, msg.loss_fn, config, data, bool(msg.forward_only)
    )


def _unzstd(raw: bytes) -> bytes:
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompress(raw, max_output_size=MAX_DECOMPRESSED)
    except zstandard.ZstdError as e:
        raise EndpointError(400, f"body: invalid zstd data ({e})") from None


def _datum(i: int, d: pb.Datum) -> Datum:
    tokens = []
    for j, chunk in enumerate(d.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise EndpointError(
                400, f"data[{i}].model_input.chunks[{j}]: {kind} chunks are not served (text only)"
            )
        tokens.append(_buffer(chunk.encoded_text.tokens, np.int32, f"data[{i}] tokens"))
    ids = np.concatenate(tokens).astype(np.int64) if tokens else np.zeros(0, np.int64)
    if len(ids) == 0:
        raise EndpointError(400, f"data[{i}].model_input: empty")
    inputs = {}
    for name, tensor in d.loss_fn_inputs.items():
        where = f"data[{i}].loss_fn_inputs.{name}"
        values = tensor_array(tensor, where)
        if values.shape != (len(ids),):
            raise EndpointError(
                400,
                f"{where}: shape {list(values.shape)}; expected [{len(ids)}] (one value per "
                "model_input position)",
            )
        want = np.int64 if name in _INTEGER_INPUTS else np.float32
        if want is np.float32 and not np.isfinite(values).all():
            raise EndpointError(400, f"{where}: holds NaN or infinity")
        inputs[name] = values.astype(want)
    return Datum(ids, inputs)


def tensor_array(t: pb.Tensor, where: str) -> np.ndarray:
    """A dense numpy array of a public ``Tensor`` (a sparse CSR one is filled with 0)."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise EndpointError(400, f"{where}: unsupported dtype {t.dtype}")
    shape = [int(s) for s in t.shape]
    if t.WhichOneof("encoding") == "sparse_csr":
        csr = t.sparse_csr
        values = _buffer(csr.values, dtype, where)
        crow = _buffer(csr.crow_indices, np.int64, where)
        col = _buffer(csr.col_indices, np.int64, where)
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise EndpointError(400, f"{where}: inconsistent sparse CSR layout")
        if len(col) and (col.min() < 0 or col.max() >= shape[1]) or np.any(np.diff(crow) < 0):
            raise EndpointError(400, f"{where}: sparse CSR indices out of range")
        dense = np.zeros(shape, dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(crow))
        if len(rows) != len(col):
            raise EndpointError(400, f"{where}: inconsistent sparse CSR layout")
        dense[rows, col] = values
        return dense
    values = _buffer(t.dense, dtype, where)
    if not shape:
        shape = [len(values)]
    if math.prod(shape) != len(values):
        raise EndpointError(400, f"{where}: shape {shape} does not hold {len(values)} values")
    return values.reshape(shape)


def _buffer(raw: bytes, dtype: type | np.dtype, where: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise EndpointError(400, f"{where}: {len(raw)} bytes is not a whole number of values")
    return np.frombuffer(raw, dtype=dtype).copy()


def encode_forward_backward(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> bytes:
    """``ForwardBackwardOutput``: one ArrayRecord of every datum's 1-D float32 outputs."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in outputs[0] if outputs else ():
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
        bt = record.fields[name]
        bt.data = b"".join(a.tobytes() for a in arrays)
        bt.offsets = offsets.tobytes()
        bt.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stop: bool  # True: a stop token or string ended it; False: its length


def encode_sample(sequences: list[Sequence], prompt_logprobs: np.ndarray | None) -> bytes:
    """``SampleResponse``: tokens as int32, log-probs as float32 (NaN: not computed)."""
    msg = pb.SampleResponse()
    for s in sequences:
        msg.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if s.stop else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(s.tokens, np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    return msg.SerializeToString()
