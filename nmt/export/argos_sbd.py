"""A rule-based sentence splitter in the format of MiniSBD, the splitter of Argos Translate 1.10+.

Argos Translate splits every paragraph into sentences before translating, with the `minisbd/*.onnx`
model bundled in a package, else a `stanza/` folder (stanza's Pipeline downloads `resources.json`
on every start), else a MiniSBD model it downloads for the source language. nmt has no trained
splitter, so `nmt export --format argos` bundles this one: a six-node ONNX graph, written here
byte by byte (ONNX is protobuf; no `onnx` package needed), that MiniSBD runs like its own models.

The rule (MiniSBD's labels per character: 1 token end, 2 token and sentence end): a sentence ends
at a run of sentence-final marks (。！？!? ｡) and the closing quotes or brackets right after them
(”’」』）)》〉】〕"'), unless the run goes on. So `他说：“走吧！”然后走了。` is one split, after `”`,
and `3.5`, `Mr. Li` or `……` never split (nmt's corpus is one sentence or a few per line; a
sentence of Chinese ends with a full-width mark). Every character is a token of its own (Argos
uses only the sentences).

How the graph computes it: each character id is looked up in a (V, 2) table of
[mark or closer, mark]; a width-4 convolution over positions t-2 … t+1 scores
4·m(t) − 4·m(t+1) + f(t) + f(t−1) + f(t−2) − 4.5, positive exactly when t ends a run that holds a
sentence-final mark within its last three characters; that score is the logit of label 2
against 0 for label 1.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

FINAL_MARKS = "。！？!?｡"
CLOSERS = "”’」』）)》〉】〕\"'"
_VOCAB = ["<PAD>", "<UNK>", *FINAL_MARKS, *CLOSERS]  # MiniSBD's ids: 0 pad, 1 unknown
_CONFIG = {"max_seqlen": 1000, "batch_size": 32, "feat_funcs": [], "use_dictionary": False, "num_dict_feat": 0}
_FLOAT, _INT64, _INTS = 1, 7, 7  # ONNX TensorProto.FLOAT / INT64, AttributeProto.INTS


# --------------------------------------------------------------------------- protobuf, by hand


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _msg(field: int, payload: bytes | str) -> bytes:
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, dims: list[int], kind: int, values: Iterable[float]) -> bytes:
    fmt = "f" if kind == _FLOAT else "q"
    data = b"".join(struct.pack(f"<{fmt}", v) for v in values)
    return b"".join(_int(1, d) for d in dims) + _int(2, kind) + _msg(8, name) + _msg(9, data)


def _value_info(name: str, kind: int, dims: list[str]) -> bytes:
    shape = b"".join(_msg(1, _msg(2, d)) for d in dims)  # symbolic dimensions
    return _msg(1, name) + _msg(2, _msg(1, _int(1, kind) + _msg(2, shape)))


def _node(op: str, inputs: list[str], output: str, perm: list[int] | None = None) -> bytes:
    body = b"".join(_msg(1, i) for i in inputs) + _msg(2, output) + _msg(3, output) + _msg(4, op)
    if perm is not None:
        body += _msg(5, _msg(1, "perm") + b"".join(_int(8, p) for p in perm) + _int(20, _INTS))
    return body


# --------------------------------------------------------------------------- the model


def _table() -> list[float]:
    """(V, 2) rows [final mark or closer, final mark] of every vocabulary entry."""
    rows = []
    for unit in _VOCAB:
        final = unit in FINAL_MARKS and len(unit) == 1
        rows += [1.0 if final or (unit in CLOSERS and len(unit) == 1) else 0.0, 1.0 if final else 0.0]
    return rows


def _graph() -> bytes:
    weights = [0.0, 0.0, 4.0, -4.0, 1.0, 1.0, 1.0, 0.0]  # (1 out, 2 in, 4 taps t-2 … t+1)
    initializers = [
        _tensor("table", [len(_VOCAB), 2], _FLOAT, _table()),
        _tensor("pads", [6], _INT64, [0, 0, 2, 0, 0, 1]),
        _tensor("weight", [1, 2, 4], _FLOAT, weights),
        _tensor("bias", [1], _FLOAT, [-4.5]),
        _tensor("to_labels", [1, 5], _FLOAT, [0.0, 0.0, 1.0, 0.0, 0.0]),
        _tensor("label_bias", [5], _FLOAT, [-100.0, 0.0, 0.0, -100.0, -100.0]),
    ]
    nodes = [
        _node("Gather", ["table", "units"], "classes"),  # (B, T, 2)
        _node("Transpose", ["classes"], "channels", perm=[0, 2, 1]),  # (B, 2, T)
        _node("Pad", ["channels", "pads"], "padded"),  # (B, 2, T + 3)
        _node("Conv", ["padded", "weight", "bias"], "score"),  # (B, 1, T)
        _node("Transpose", ["score"], "scores", perm=[0, 2, 1]),  # (B, T, 1)
        _node("MatMul", ["scores", "to_labels"], "spread"),  # (B, T, 5)
        _node("Add", ["spread", "label_bias"], "logits"),
    ]
    return (
        b"".join(_msg(1, n) for n in nodes)
        + _msg(2, "nmt_sbd")
        + b"".join(_msg(5, t) for t in initializers)
        + _msg(11, _value_info("units", _INT64, ["batch", "chars"]))
        + _msg(11, _value_info("features", _FLOAT, ["batch", "chars", "feats"]))  # MiniSBD feeds it; unused
        + _msg(12, _value_info("logits", _FLOAT, ["batch", "chars", "labels"]))
    )


def minisbd_model(lang_code: str) -> bytes:
    """The serialized ONNX model (ir 8, opset 13) with MiniSBD's metadata: lang_code, config, vocab."""
    vocab = {"lang": lang_code, "idx": 0, "cutoff": 0, "lower": False}
    vocab |= {"_id2unit": _VOCAB, "_unit2id": {u: i for i, u in enumerate(_VOCAB)}}
    meta = {"lang_code": lang_code, "config": json.dumps(_CONFIG), "vocab": json.dumps(vocab), "lexicon": "null"}
    return (
        _int(1, 8)
        + _msg(2, "nmt")
        + _msg(7, _graph())
        + _msg(8, _msg(1, "") + _int(2, 13))
        + b"".join(_msg(14, _msg(1, k) + _msg(2, v)) for k, v in meta.items())
    )


def split_sentences(text: str) -> list[str]:
    """The same rule in Python (what MiniSBD makes of the ONNX model's labels), for tests and reports."""
    marks = [c in FINAL_MARKS or c in CLOSERS for c in text] + [False]
    ends = [
        i
        for i in range(len(text))
        if marks[i] and not marks[i + 1] and any(c in FINAL_MARKS for c in text[max(0, i - 2) : i + 1])
    ]
    bounds = [0, *(i + 1 for i in ends if i + 1 < len(text)), len(text)]
    parts = (text[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False))
    return [p for p in parts if p]
