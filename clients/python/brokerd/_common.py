"""What the blocking and the asyncio clients share: where brokerd is,
building requests, and turning answers into Python values."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import zstandard

from brokerd._gen.broker.v1 import broker_pb2 as pb

ROOT_SOCKET = "/run/brokerd/brokerd.sock"


def default_target(socket: Optional[str] = None, address: Optional[str] = None) -> Tuple[str, bool]:
    """The gRPC target of brokerd and whether it is TCP.

    An explicit address or socket wins; else BROKERD_ADDR, else
    BROKERD_SOCKET, else the socket brokerd listens on by default for this
    user (/run/brokerd/brokerd.sock for root, else $XDG_RUNTIME_DIR/brokerd.sock,
    else /tmp/brokerd-UID/brokerd.sock) — the same rules as brokerctl.
    """
    if address:
        return address, True
    if not socket:
        env_addr = os.environ.get("BROKERD_ADDR")
        if env_addr:
            return env_addr, True
        socket = os.environ.get("BROKERD_SOCKET")
    if not socket:
        if os.geteuid() == 0:
            socket = ROOT_SOCKET
        elif os.environ.get("XDG_RUNTIME_DIR"):
            socket = os.path.join(os.environ["XDG_RUNTIME_DIR"], "brokerd.sock")
        else:
            socket = f"/tmp/brokerd-{os.geteuid()}/brokerd.sock"
    return "unix://" + os.path.abspath(socket), False


FIDELITY = {
    "semantic": pb.FIDELITY_SEMANTIC,
    "lossless": pb.FIDELITY_LOSSLESS,
    "both": pb.FIDELITY_BOTH,
}
PRIORITY = {"low": pb.PRIORITY_LOW, "normal": pb.PRIORITY_NORMAL, "high": pb.PRIORITY_HIGH}


class SignatureError(ValueError):
    """A code does not decompress to the bytes its signature names."""


# A code is at most an item, and items are bounded by brokerd's
# --max-item-bytes; this bounds what decode inflates from a hostile code.
MAX_DECODED = 1 << 30


def verify(original: bytes, signature: str) -> None:
    """Raise SignatureError unless sha256(original) is the signature."""
    algo, _, digest = signature.partition(":")
    if algo != "sha256" or not digest:
        raise SignatureError(f"signature {signature!r} is not sha256:HEX")
    if hashlib.sha256(original).hexdigest() != digest:
        raise SignatureError("the bytes do not match the signature")


@dataclass
class EncodeResult:
    """One item's answer: the vector, the compressed code and the signature."""

    id: str
    vector: Optional[np.ndarray]  # float32, or None for lossless alone
    code: bytes
    codec: str
    signature: str
    device_id: str
    truncated: bool

    def decode(self) -> bytes:
        """The original bytes, decompressed from the code and checked against
        the signature."""
        if not self.code:
            raise ValueError("the result has no code (encode with fidelity 'lossless' or 'both')")
        if self.codec != "zstd":
            raise ValueError(f"unknown codec {self.codec!r}")
        d = zstandard.ZstdDecompressor()
        with d.stream_reader(self.code) as r:
            out = r.read(MAX_DECODED + 1)
        if len(out) > MAX_DECODED:
            raise ValueError(f"the code decompresses to more than {MAX_DECODED} bytes")
        verify(out, self.signature)
        return out

    def text(self) -> str:
        """decode() as UTF-8 text."""
        return self.decode().decode("utf-8")


@dataclass
class Encoded:
    results: List[EncodeResult]
    model: str
    model_version: int
    execution: pb.ExecutionInfo


def encode_request(items: Iterable[Union[str, bytes]], model: str, fidelity: str, normalize: Optional[bool],
                   truncate: Optional[bool], priority: Optional[str], ids: Optional[Sequence[str]]) -> pb.EncodeRequest:
    req = pb.EncodeRequest(model=model or "")
    if fidelity not in FIDELITY:
        raise ValueError(f"fidelity {fidelity!r}: want semantic, lossless or both")
    req.fidelity = FIDELITY[fidelity]
    if normalize is not None:
        req.normalize = normalize
    if truncate is not None:
        req.truncate = truncate
    if priority:
        req.priority = PRIORITY[priority]
    for i, item in enumerate(items):
        it = req.items.add(id=str(ids[i]) if ids is not None else str(i))
        if isinstance(item, str):
            it.text = item
        elif isinstance(item, (bytes, bytearray, memoryview)):
            it.data = bytes(item)
        else:
            raise TypeError(f"item {i}: want str or bytes, got {type(item).__name__}")
    return req


class _Assembler:
    """Puts EncodeStream's ordered parts back together."""

    def __init__(self, n: int):
        self.n = n
        self.results: List[EncodeResult] = []
        self.model, self.version, self.execution = "", 0, pb.ExecutionInfo()

    def add(self, part: pb.EncodeStreamResponse) -> None:
        if part.offset != len(self.results) or part.total > self.n:
            raise RuntimeError(f"brokerd sent a part at offset {part.offset} after {len(self.results)} results")
        for r in part.results:
            self.results.append(EncodeResult(
                id=r.id, vector=np.asarray(r.vector, dtype=np.float32) if len(r.vector) else None,
                code=r.code, codec=r.codec, signature=r.signature, device_id=r.device_id, truncated=r.truncated))
        if part.HasField("execution"):
            self.model, self.version, self.execution = part.model, part.model_version, part.execution

    def done(self) -> Encoded:
        if len(self.results) != self.n:
            raise RuntimeError(f"brokerd returned {len(self.results)} results for {self.n} items")
        return Encoded(self.results, self.model, self.version, self.execution)


# --- generation -------------------------------------------------------------

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "seed", "max_tokens", "stop", "stop_token_ids", "logprobs",
             "top_logprobs", "ignore_eos", "logit_bias")

# Structured output: at most one of these keeps the answer inside it.
_CONSTRAINTS = ("json_object", "json_schema", "regex", "grammar")


def constraint(kw: Mapping) -> Optional[pb.Constraint]:
    """The structured-output constraint of json_object=True (any JSON
    object), json_schema=SCHEMA (a dict or JSON text), regex=RE (a full
    match, RE2 syntax) or grammar=GBNF (llama.cpp's, start rule root)."""
    given = [k for k in _CONSTRAINTS if kw.get(k) not in (None, False)]
    if len(given) > 1:
        raise ValueError(f"at most one structured-output constraint: {', '.join(given)}")
    if not given:
        return None
    k, v = given[0], kw[given[0]]
    if k == "json_object":
        return pb.Constraint(kind=pb.Constraint.KIND_JSON)
    if k == "json_schema":
        return pb.Constraint(kind=pb.Constraint.KIND_JSON_SCHEMA, source=v if isinstance(v, str) else json.dumps(v))
    if k == "regex":
        return pb.Constraint(kind=pb.Constraint.KIND_REGEX, source=v)
    return pb.Constraint(kind=pb.Constraint.KIND_GBNF, source=v)


def sampling(kw: Mapping) -> Optional[pb.SamplingParams]:
    unknown = set(kw) - set(_SAMPLING) - set(_CONSTRAINTS)
    if unknown:
        raise TypeError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
    if not kw:
        return None
    s = pb.SamplingParams()
    con = constraint(kw)
    if con is not None:
        s.constraint.CopyFrom(con)
    for k, v in kw.items():
        if v is None or k in _CONSTRAINTS:
            continue
        if k in ("stop", "stop_token_ids"):
            getattr(s, k).extend([v] if isinstance(v, (str, int)) else v)
        elif k == "logit_bias":  # {token id: -100 to 100}
            s.logit_bias.update({int(t): float(b) for t, b in v.items()})
        else:
            setattr(s, k, v)
    return s


@dataclass
class TokenLogprob:
    """A token, its text (vLLM's "bytes:\\xNN" form when it is part of a
    UTF-8 character; `bytes` has it raw) and its log-probability."""

    token_id: int
    text: str
    logprob: float
    bytes: bytes = b""


@dataclass
class Logprob:
    """A chosen token's log-probability and the `top_logprobs` most likely
    alternatives at its position."""

    chosen: TokenLogprob
    top: List[TokenLogprob] = field(default_factory=list)


@dataclass
class ToolCall:
    """A call of one of a chat's tools, parsed from the model's output:
    `arguments` is a JSON object's text (args() decodes it); `index` its
    position among the answer's calls; `id` is "call_..."."""

    id: str
    name: str
    arguments: str
    index: int = 0

    def args(self) -> dict:
        return json.loads(self.arguments)

    def message(self) -> dict:
        """The call as a history message's tool_calls entry (OpenAI's shape)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Delta:
    """Text of prompt `index` as it is sampled; `reasoning` is a thinking
    model's thinking (chat), never part of `text`; `tool_calls` the calls of
    a chat's tools that ended in this delta (each whole), never part of
    `text`; `logprobs` one entry per token of token_ids when asked for
    (logprobs=True, top_logprobs=N)."""

    index: int
    text: str
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[Logprob] = field(default_factory=list)
    reasoning: str = ""
    tool_calls: List[ToolCall] = field(default_factory=list)


def _token_logprob(t) -> TokenLogprob:
    return TokenLogprob(t.token_id, t.text, t.logprob, bytes(t.bytes))


@dataclass
class Finished:
    """Prompt `index` is done: why, its token counts, and where it ran."""

    index: int
    finish_reason: str  # stop, length, deadline, tool_calls, constraint
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token: float
    device_id: str


def events(msg) -> List[Union[Delta, Finished]]:
    out: List[Union[Delta, Finished]] = []
    for d in msg.deltas:
        lps = [Logprob(_token_logprob(e.chosen), [_token_logprob(t) for t in e.top]) for e in d.logprobs]
        calls = [ToolCall(t.id, t.name, t.arguments, t.index) for t in d.tool_calls]
        out.append(Delta(d.index, d.text, list(d.token_ids), lps, d.reasoning, calls))
    for r in msg.results:
        reason = pb.FinishReason.Name(r.finish_reason).removeprefix("FINISH_REASON_").lower()
        ttft = r.time_to_first_token.seconds + r.time_to_first_token.nanos / 1e9
        out.append(Finished(r.index, reason, r.usage.prompt_tokens, r.usage.completion_tokens, ttft,
                            r.execution.device_id))
    return out


def generate_request(model: str, prompts: Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]],
                     max_time: Optional[float], priority: Optional[str], kw: Mapping) -> pb.GenerateRequest:
    """prompts: a text, texts, a prompt of token ids, or prompts of token ids
    (run as they are: no special tokens added)."""
    if isinstance(prompts, str):
        req = pb.GenerateRequest(model=model, prompts=[prompts])
    else:
        items = list(prompts)
        if items and all(isinstance(p, int) for p in items):
            req = pb.GenerateRequest(model=model, token_prompts=[pb.TokenPrompt(ids=items)])
        elif items and all(not isinstance(p, str) for p in items):
            req = pb.GenerateRequest(model=model, token_prompts=[pb.TokenPrompt(ids=list(p)) for p in items])
        else:
            req = pb.GenerateRequest(model=model, prompts=items)
    return _generation_options(req, max_time, priority, kw)


Message = Mapping[str, Any]

_TOOL_CHOICE = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "none": pb.TOOL_CHOICE_MODE_NONE,
                "required": pb.TOOL_CHOICE_MODE_REQUIRED}


def _history_call(i: int, tc) -> pb.ToolCall:
    """A history message's call: a ToolCall, or OpenAI's dict (arguments a
    JSON string or a dict)."""
    if isinstance(tc, ToolCall):
        return pb.ToolCall(id=tc.id, name=tc.name, arguments=tc.arguments, index=i)
    fn = tc.get("function", tc)
    args = fn.get("arguments", {})
    if not isinstance(args, str):
        args = json.dumps(args)
    return pb.ToolCall(id=tc.get("id", ""), name=fn["name"], arguments=args, index=i)


def chat_request(model: str, conversations: Union[Sequence[Message], Sequence[Sequence[Message]]],
                 max_time: Optional[float], priority: Optional[str], kw: Mapping) -> pb.ChatRequest:
    """conversations: one conversation (a list of {"role", "content"}, and
    "reasoning" for an earlier answer's thinking, "tool_calls" for its calls,
    "tool_call_id" for a "tool" message's result) or several. kw may hold
    enable_thinking (a thinking model's chat template variable),
    chat_template_kwargs (a dict of more variables), tools (OpenAI's
    [{"type": "function", "function": {"name", "description",
    "parameters"}}], or the function dicts alone) and tool_choice ("auto",
    "none", "required" or {"type": "function", "function": {"name": ...}})
    besides sampling."""
    if conversations and isinstance(conversations[0], Mapping):
        conversations = [conversations]  # type: ignore[list-item]
    kw = dict(kw)
    thinking = kw.pop("enable_thinking", None)
    template_kwargs = kw.pop("chat_template_kwargs", None)
    tools = kw.pop("tools", None)
    tool_choice = kw.pop("tool_choice", None)
    req = pb.ChatRequest(model=model)
    for conv in conversations:
        c = req.conversations.add()
        for m in conv:  # type: ignore[union-attr]
            c.messages.add(role=m["role"], content=m.get("content") or "", reasoning=m.get("reasoning", ""),
                           tool_calls=[_history_call(i, tc) for i, tc in enumerate(m.get("tool_calls") or [])],
                           tool_call_id=m.get("tool_call_id", ""))
    if thinking is not None:
        req.enable_thinking = bool(thinking)
    if template_kwargs:
        req.chat_template_kwargs.update(template_kwargs)
    for t in tools or []:
        fn = t.get("function", t)
        params = fn.get("parameters")
        req.tools.add(name=fn["name"], description=fn.get("description", ""),
                      parameters="" if params is None else json.dumps(params))
    if isinstance(tool_choice, str):
        if tool_choice not in _TOOL_CHOICE:
            raise ValueError(f"tool_choice {tool_choice!r}: want auto, none, required or a function")
        req.tool_choice = _TOOL_CHOICE[tool_choice]
    elif tool_choice is not None:
        req.tool_choice = pb.TOOL_CHOICE_MODE_FUNCTION
        req.tool_choice_function = tool_choice.get("function", tool_choice)["name"]
    return _generation_options(req, max_time, priority, kw)


def _generation_options(req, max_time: Optional[float], priority: Optional[str], kw: Mapping):
    """Sets what GenerateRequest and ChatRequest share."""
    s = sampling(kw)
    if s is not None:
        req.sampling.CopyFrom(s)
    if max_time:
        req.max_time.FromNanoseconds(int(max_time * 1e9))
    if priority:
        req.priority = PRIORITY[priority]
    return req


# --- tensors ----------------------------------------------------------------

_DTYPES = {
    np.dtype(np.float32): pb.DATA_TYPE_FP32, np.dtype(np.float16): pb.DATA_TYPE_FP16,
    np.dtype(np.float64): pb.DATA_TYPE_FP64, np.dtype(np.int8): pb.DATA_TYPE_INT8,
    np.dtype(np.int16): pb.DATA_TYPE_INT16, np.dtype(np.int32): pb.DATA_TYPE_INT32,
    np.dtype(np.int64): pb.DATA_TYPE_INT64, np.dtype(np.uint8): pb.DATA_TYPE_UINT8,
    np.dtype(np.bool_): pb.DATA_TYPE_BOOL,
}
_NUMPY = {v: k for k, v in _DTYPES.items()}


def to_tensor(name: str, value) -> pb.Tensor:
    """A NumPy array (or something np.asarray takes) as a Tensor; strings and
    bytes (dtype object, str_ or bytes_) become BYTES."""
    a = np.asarray(value)
    if a.dtype.kind in ("U", "S", "O"):
        buf = bytearray()
        for x in a.reshape(-1):
            b = x.encode("utf-8") if isinstance(x, str) else bytes(x)
            buf += struct.pack("<I", len(b)) + b
        return pb.Tensor(name=name, dtype=pb.DATA_TYPE_BYTES, shape=list(a.shape), data=bytes(buf))
    if a.dtype not in _DTYPES:
        raise TypeError(f"input {name}: dtype {a.dtype} is not one brokerd takes")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return pb.Tensor(name=name, dtype=_DTYPES[a.dtype], shape=list(a.shape), data=a.tobytes())


def from_tensor(t: pb.Tensor) -> np.ndarray:
    """A Tensor of brokerd's answer as a NumPy array (BYTES: dtype object of bytes)."""
    shape = tuple(t.shape)
    if t.dtype == pb.DATA_TYPE_BYTES:
        out, data, i = [], t.data, 0
        while i < len(data):
            (n,) = struct.unpack_from("<I", data, i)
            out.append(bytes(data[i + 4:i + 4 + n]))
            i += 4 + n
        return np.array(out, dtype=object).reshape(shape)
    if t.dtype not in _NUMPY:
        raise TypeError(f"output {t.name}: datatype {pb.DataType.Name(t.dtype)} has no NumPy dtype here")
    return np.frombuffer(t.data, dtype=_NUMPY[t.dtype].newbyteorder("<")).reshape(shape)


def infer_request(model: str, inputs: Mapping[str, object], outputs: Optional[Sequence[str]],
                  version: int, priority: Optional[str]) -> pb.InferRequest:
    req = pb.InferRequest(model=model, model_version=version)
    for name, value in inputs.items():
        req.inputs.append(to_tensor(name, value))
    if outputs:
        req.outputs.extend(outputs)
    if priority:
        req.priority = PRIORITY[priority]
    return req


def infer_outputs(resp: pb.InferResponse) -> Dict[str, np.ndarray]:
    return {t.name: from_tensor(t) for t in resp.outputs}


def tokenize_request(model: str, prompts, messages, add_special_tokens: Optional[bool], kw: Mapping) -> pb.TokenizeRequest:
    """prompts: a text or texts; or messages: a conversation or several,
    with chat()'s options (enable_thinking, chat_template_kwargs, tools,
    tool_choice), counted as chat() would run them."""
    if (prompts is None) == (messages is None):
        raise ValueError("give prompts or messages")
    req = pb.TokenizeRequest(model=model)
    if messages is not None:
        req.chat.CopyFrom(chat_request(model, messages, None, None, kw))
    else:
        req.prompts.extend([prompts] if isinstance(prompts, str) else list(prompts))
        if add_special_tokens is not None:
            req.add_special_tokens = add_special_tokens
    return req
