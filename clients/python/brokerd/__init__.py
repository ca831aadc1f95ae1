"""Python client of brokerd's gRPC API.

    import brokerd
    with brokerd.Client() as c:                       # BROKERD_ADDR, BROKERD_SOCKET or the default socket
        for r in c.encode(["the council meets at dawn"]):
            print(len(r.vector), r.signature, r.text())
        for ev in c.chat("qwen-tiny", [{"role": "user", "content": "Hello"}], max_tokens=16):
            ...

brokerd.AsyncClient is the same for asyncio. Errors are brokerd.errors
classes (NotFound, InvalidArgument, ResourceExhausted with retry_after, ...).
"""

from brokerd._common import Delta, EncodeResult, Encoded, Finished, Logprob, SignatureError, TokenLogprob, ToolCall, verify
from brokerd.aio import AsyncClient
from brokerd.client import Client, text
from brokerd.errors import BrokerdError, retry_delay
from brokerd import errors

__all__ = ["Client", "AsyncClient", "EncodeResult", "Encoded", "Delta", "Finished", "Logprob", "TokenLogprob", "ToolCall", "SignatureError",
           "verify", "text", "BrokerdError", "retry_delay", "errors"]
