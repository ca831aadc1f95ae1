"""The asyncio client: the blocking client's methods as coroutines, and
generate()/chat() as async iterators."""

from __future__ import annotations

from typing import AsyncIterator, Dict, List, Mapping, Optional, Sequence, Union

import grpc
import grpc.aio
import numpy as np

from brokerd import _common as c
from brokerd._gen.broker.v1 import broker_pb2 as pb
from brokerd._gen.broker.v1 import broker_pb2_grpc as pb_grpc
from brokerd.client import _HEALTH, _health_request, _serving
from brokerd.errors import from_rpc_error


class AsyncClient:
    """Client for asyncio programs; the same arguments as brokerd.Client.
    Use it as `async with AsyncClient() as c:` or close() it."""

    def __init__(self, socket: Optional[str] = None, address: Optional[str] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None, timeout: Optional[float] = None,
                 options: Sequence = ()):
        target, tcp = c.default_target(socket, address)
        self.target = target
        if tcp and credentials is not None:
            self._channel = grpc.aio.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.aio.insecure_channel(target, options=list(options))
        self._stub = pb_grpc.BrokerServiceStub(self._channel)
        self._health = self._channel.unary_unary(_HEALTH, request_serializer=None, response_deserializer=None)
        self.timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method, request, timeout=None):
        try:
            return await method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def healthy(self) -> bool:
        try:
            return _serving(await self._health(_health_request(), timeout=self.timeout))
        except grpc.RpcError as e:
            err = from_rpc_error(e)
            if err.code == grpc.StatusCode.UNAVAILABLE:
                return False
            raise err from None

    async def devices(self) -> List[pb.Device]:
        return list((await self._call(self._stub.ListDevices, pb.ListDevicesRequest())).devices)

    async def models(self) -> List[pb.Model]:
        return list((await self._call(self._stub.ListModels, pb.ListModelsRequest())).models)

    async def load(self, name: str, version: int = 0) -> pb.LoadModelResponse:
        return await self._call(self._stub.LoadModel, pb.LoadModelRequest(name=name, version=version))

    async def unload(self, name: str) -> None:
        await self._call(self._stub.UnloadModel, pb.UnloadModelRequest(name=name))

    async def stats(self, model: str = "") -> List[pb.QueueStats]:
        """A row per model version (device_id empty) and per replica; a
        generator's rows carry ``generation`` (tokens/s over the last 10 s,
        TTFT and inter-token quantiles, KV-cache blocks, preemptions)."""
        return list((await self._call(self._stub.GetStats, pb.GetStatsRequest(model=model))).stats)

    async def encode(self, items: Sequence[Union[str, bytes]], model: str = "", fidelity: str = "both",
                     normalize: Optional[bool] = None, truncate: Optional[bool] = None,
                     priority: Optional[str] = None, ids: Optional[Sequence[str]] = None,
                     timeout: Optional[float] = None) -> List[c.EncodeResult]:
        return (await self.encode_full(items, model, fidelity, normalize, truncate, priority, ids, timeout)).results

    async def encode_full(self, items, model="", fidelity="both", normalize=None, truncate=None, priority=None,
                          ids=None, timeout=None) -> c.Encoded:
        items = list(items)
        req = c.encode_request(items, model, fidelity, normalize, truncate, priority, ids)
        asm = c._Assembler(len(items))
        try:
            async for part in self._stub.EncodeStream(pb.EncodeStreamRequest(request=req), timeout=timeout or self.timeout):
                asm.add(part)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return asm.done()

    async def infer(self, model: str, inputs: Mapping[str, object], outputs: Optional[Sequence[str]] = None,
                    version: int = 0, priority: Optional[str] = None,
                    timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        req = c.infer_request(model, inputs, outputs, version, priority)
        return c.infer_outputs(await self._call(self._stub.Infer, req, timeout))

    def generate(self, model: str, prompts: Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]], max_time: Optional[float] = None,
                 priority: Optional[str] = None, timeout: Optional[float] = None,
                 **sampling) -> AsyncIterator[Union[c.Delta, c.Finished]]:
        req = c.generate_request(model, prompts, max_time, priority, sampling)
        return self._stream(self._stub.Generate, req, timeout)

    def chat(self, model: str, messages, max_time: Optional[float] = None, priority: Optional[str] = None,
             timeout: Optional[float] = None, **sampling) -> AsyncIterator[Union[c.Delta, c.Finished]]:
        req = c.chat_request(model, messages, max_time, priority, sampling)
        return self._stream(self._stub.Chat, req, timeout)

    async def tokenize(self, model: str, prompts: Union[str, Sequence[str], None] = None, messages=None,
                       add_special_tokens: Optional[bool] = None, timeout: Optional[float] = None, **chat) -> List[List[int]]:
        req = c.tokenize_request(model, prompts, messages, add_special_tokens, chat)
        return [list(r.ids) for r in (await self._call(self._stub.Tokenize, req, timeout)).results]

    async def detokenize(self, model: str, ids: Sequence[int], timeout: Optional[float] = None) -> str:
        return (await self._call(self._stub.Detokenize, pb.DetokenizeRequest(model=model, ids=list(ids)), timeout)).text

    async def _stream(self, method, req, timeout):
        call = method(req, timeout=timeout or self.timeout)
        try:
            async for msg in call:
                for ev in c.events(msg):
                    yield ev
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()


__all__ = ["AsyncClient"]
