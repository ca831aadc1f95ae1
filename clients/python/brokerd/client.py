"""The blocking client."""

from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from brokerd import _common as c
from brokerd._gen.broker.v1 import broker_pb2 as pb
from brokerd._gen.broker.v1 import broker_pb2_grpc as pb_grpc
from brokerd.errors import BrokerdError, from_rpc_error

_HEALTH = "/grpc.health.v1.Health/Check"


def _health_request() -> bytes:
    return b""  # HealthCheckRequest{service: ""} is the empty message


def _serving(resp: bytes) -> bool:
    # HealthCheckResponse{status = 1: SERVING} is field 1 varint 1.
    return resp == b"\x08\x01"


def channel_target(socket: Optional[str], address: Optional[str]):
    return c.default_target(socket, address)


class Client:
    """A connection to brokerd (its Unix socket by default).

    Client() finds brokerd as brokerctl does: address= or socket= when given,
    else BROKERD_ADDR, else BROKERD_SOCKET, else the default socket of this
    user. credentials= (grpc.ssl_channel_credentials(...)) uses TLS on an
    address. Every method raises a brokerd.errors.BrokerdError subclass on
    failure; timeout= (seconds) bounds each call.
    """

    def __init__(self, socket: Optional[str] = None, address: Optional[str] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None, timeout: Optional[float] = None,
                 options: Sequence = ()):
        target, tcp = c.default_target(socket, address)
        self.target = target
        if tcp and credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options))
        self._stub = pb_grpc.BrokerServiceStub(self._channel)
        self._health = self._channel.unary_unary(_HEALTH, request_serializer=None, response_deserializer=None)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    # --- inventory and administration ---------------------------------

    def healthy(self) -> bool:
        """True when brokerd reports SERVING (False while it drains)."""
        try:
            return _serving(self._health(_health_request(), timeout=self.timeout))
        except grpc.RpcError as e:
            err = from_rpc_error(e)
            if err.code == grpc.StatusCode.UNAVAILABLE:
                return False
            raise err from None

    def devices(self) -> List[pb.Device]:
        return list(self._call(self._stub.ListDevices, pb.ListDevicesRequest()).devices)

    def models(self) -> List[pb.Model]:
        return list(self._call(self._stub.ListModels, pb.ListModelsRequest()).models)

    def load(self, name: str, version: int = 0) -> pb.LoadModelResponse:
        """Load a model of the repository (version 0: the newest); admin role."""
        return self._call(self._stub.LoadModel, pb.LoadModelRequest(name=name, version=version))

    def unload(self, name: str) -> None:
        """Unload a model; admin role."""
        self._call(self._stub.UnloadModel, pb.UnloadModelRequest(name=name))

    def stats(self, model: str = "") -> List[pb.QueueStats]:
        """A row per model version (device_id empty) and per replica; a
        generator's rows carry ``generation`` (tokens/s over the last 10 s,
        TTFT and inter-token quantiles, KV-cache blocks, preemptions)."""
        return list(self._call(self._stub.GetStats, pb.GetStatsRequest(model=model)).stats)

    # --- data plane -------------------------------------------------------

    def encode(self, items: Sequence[Union[str, bytes]], model: str = "", fidelity: str = "both",
               normalize: Optional[bool] = None, truncate: Optional[bool] = None,
               priority: Optional[str] = None, ids: Optional[Sequence[str]] = None,
               timeout: Optional[float] = None) -> List[c.EncodeResult]:
        """Encode texts (str) or records (bytes) with model ("" is the built-in
        encoder); per item the vector, the code and the signature, in order.
        See encode_full for the model version and execution info."""
        return self.encode_full(items, model, fidelity, normalize, truncate, priority, ids, timeout).results

    def encode_full(self, items, model="", fidelity="both", normalize=None, truncate=None, priority=None,
                    ids=None, timeout=None) -> c.Encoded:
        """encode(), with the model version and the execution info (device,
        batch sizes, queue and compute time, cost). The answer comes through
        EncodeStream in parts, so no answer hits gRPC's 4 MiB receive limit."""
        items = list(items)
        req = c.encode_request(items, model, fidelity, normalize, truncate, priority, ids)
        asm = c._Assembler(len(items))
        try:
            for part in self._stub.EncodeStream(pb.EncodeStreamRequest(request=req), timeout=timeout or self.timeout):
                asm.add(part)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return asm.done()

    def infer(self, model: str, inputs: Mapping[str, object], outputs: Optional[Sequence[str]] = None,
              version: int = 0, priority: Optional[str] = None, timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """Run a tensor model: inputs by name (NumPy arrays; strings for BYTES),
        outputs by name as NumPy arrays."""
        req = c.infer_request(model, inputs, outputs, version, priority)
        return c.infer_outputs(self._call(self._stub.Infer, req, timeout))

    def generate(self, model: str, prompts: Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]], max_time: Optional[float] = None,
                 priority: Optional[str] = None, timeout: Optional[float] = None,
                 **sampling) -> Iterator[Union[c.Delta, c.Finished]]:
        """Stream the answers to one prompt or several (texts, or prompts of
        token ids: [1, 2, 3] or [[1, 2], [3]]): Delta(index, text,
        token_ids, logprobs) as text is sampled, Finished(index, ...) at each
        prompt's end. sampling: temperature, top_p, top_k, min_p, seed,
        max_tokens (none: to a stop or the end of the model's context), stop,
        logit_bias ({token id: bias}), logprobs and top_logprobs (each Delta's logprobs then has an entry per
        token with its text and the alternatives), structured output with one
        of json_object=True, json_schema=dict-or-text, regex=RE, grammar=GBNF
        (finish reason "constraint" when it cannot go on), ... Closing the iterator (or leaving the loop and dropping it)
        cancels the call, and brokerd frees the sequences."""
        req = c.generate_request(model, prompts, max_time, priority, sampling)
        return self._stream(self._stub.Generate, req, timeout)

    def chat(self, model: str, messages, max_time: Optional[float] = None, priority: Optional[str] = None,
             timeout: Optional[float] = None, **sampling) -> Iterator[Union[c.Delta, c.Finished]]:
        """generate() for a conversation ([{"role": "user", "content": ...}])
        or a list of conversations, rendered by the model's chat template.
        enable_thinking=True/False sets a thinking model's (Qwen3's) template
        variable, chat_template_kwargs={...} more of them; the thinking comes
        in Delta.reasoning, never in Delta.text. tools=[...] (OpenAI's tool
        dicts) are rendered by the template and the model's calls of them
        come in Delta.tool_calls (ToolCall), never in Delta.text, finish
        reason "tool_calls"; tool_choice="none" leaves them in the text,
        "required" or {"type": "function", "function": {"name": ...}}
        constrain the output to calls (the tools' schemas).
        Feed a result back with {"role": "assistant", "content": text,
        "tool_calls": [call.message()]} and {"role": "tool", "content":
        result, "tool_call_id": call.id}."""
        req = c.chat_request(model, messages, max_time, priority, sampling)
        return self._stream(self._stub.Chat, req, timeout)

    def tokenize(self, model: str, prompts: Union[str, Sequence[str], None] = None, messages=None,
                 add_special_tokens: Optional[bool] = None, timeout: Optional[float] = None, **chat) -> List[List[int]]:
        """The token ids the model runs for each prompt, or for each
        conversation of messages as chat() renders it (chat's options:
        enable_thinking, chat_template_kwargs, tools, tool_choice); nothing
        runs."""
        req = c.tokenize_request(model, prompts, messages, add_special_tokens, chat)
        return [list(r.ids) for r in self._call(self._stub.Tokenize, req, timeout).results]

    def detokenize(self, model: str, ids: Sequence[int], timeout: Optional[float] = None) -> str:
        """The text of token ids."""
        return self._call(self._stub.Detokenize, pb.DetokenizeRequest(model=model, ids=list(ids)), timeout).text

    def _stream(self, method, req, timeout):
        call = method(req, timeout=timeout or self.timeout)
        try:
            for msg in call:
                yield from c.events(msg)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()  # no-op after the end; frees the sequences when the caller stops early


def text(events) -> List[str]:
    """The whole text of each prompt of a generate() or chat() stream."""
    out: Dict[int, List[str]] = {}
    for ev in events:
        if isinstance(ev, c.Delta):
            out.setdefault(ev.index, []).append(ev.text)
        else:
            out.setdefault(ev.index, [])
    return ["".join(out.get(i, [])) for i in range(max(out) + 1 if out else 0)]


__all__ = ["Client", "text", "BrokerdError"]
