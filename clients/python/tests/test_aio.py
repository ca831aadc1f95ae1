"""The asyncio client against a real brokerd."""

import asyncio
import unittest

import numpy as np

import brokerd
from brokerd import errors
from tests.helpers import mlp_reference


class TestAsyncClient(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.c = brokerd.AsyncClient(timeout=60)
        await self.c.load("mlp")
        await self.c.load("chat")

    async def asyncTearDown(self):
        await self.c.close()

    async def test_concurrent_encodes(self):
        batches = [[f"batch {b} record {i}" for i in range(50)] for b in range(8)]
        results = await asyncio.gather(*(self.c.encode(b) for b in batches))
        for b, res in zip(batches, results):
            self.assertEqual([r.text() for r in res], b)
        self.assertTrue(await self.c.healthy())

    async def test_infer(self):
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        out = await self.c.infer("mlp", {"input": x})
        np.testing.assert_allclose(out["output"], mlp_reference(x), rtol=1e-4, atol=1e-5)

    async def test_generate_and_chat(self):
        done = [e async for e in self.c.generate("chat", ["a", "b", "c"], max_tokens=3, ignore_eos=True)
                if isinstance(e, brokerd.Finished)]
        self.assertEqual(sorted(e.index for e in done), [0, 1, 2])
        text = []
        async for e in self.c.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=4, ignore_eos=True):
            if isinstance(e, brokerd.Delta):
                text.append(e.text)
            else:
                self.assertEqual(e.completion_tokens, 4)

    async def test_tokenize(self):
        [ids] = await self.c.tokenize("chat", messages=[{"role": "user", "content": "hi"}])
        self.assertIn("hi", await self.c.detokenize("chat", ids))

    async def test_errors(self):
        with self.assertRaises(errors.NotFound):
            await self.c.load("no-such-model")
        with self.assertRaises(errors.NotFound):
            async for _ in self.c.chat("no-such-model", [{"role": "user", "content": "x"}]):
                pass


if __name__ == "__main__":
    unittest.main()
