"""The blocking client against a real brokerd (started by python_test.go)."""

import json
import time
import unittest

import grpc
import numpy as np

import brokerd
from brokerd import errors
from tests.helpers import mlp_reference, running_sequences


class TestClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = brokerd.Client(timeout=60)  # BROKERD_SOCKET from the harness
        cls.c.load("mlp")
        cls.c.load("chat")

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_health_and_inventory(self):
        self.assertTrue(self.c.healthy())
        self.assertEqual(self.c.devices()[0].id, "cpu:0")
        names = {m.name for m in self.c.models()}
        self.assertTrue({"nbmf-hash-v1", "mlp", "chat"} <= names, names)

    def test_model_labels(self):
        # A model that names its output columns lists them, in index order.
        models = {m.name: m for m in self.c.models()}
        self.assertEqual(list(models["mlp"].labels), ["low", "mid", "high"])
        self.assertEqual(list(models["chat"].labels), [])

    def test_encode_decode_verify(self):
        items = ["the council meets at dawn", "ünïcödé ✓", b"\x00\xffraw bytes"]
        res = self.c.encode(items)
        self.assertEqual([r.id for r in res], ["0", "1", "2"])
        for item, r in zip(items, res):
            self.assertEqual(r.vector.dtype, np.float32)
            self.assertEqual(r.vector.shape, (384,))
            self.assertAlmostEqual(float(np.linalg.norm(r.vector)), 1.0, places=4)
            want = item.encode() if isinstance(item, str) else item
            self.assertEqual(r.decode(), want)
            brokerd.verify(want, r.signature)
            self.assertEqual(r.device_id, "cpu:0")
        self.assertEqual(res[0].text(), items[0])
        # The same text gives the same vector, whatever shares the batch.
        again = self.c.encode(["something else", items[0]], fidelity="semantic")
        np.testing.assert_array_equal(again[1].vector, res[0].vector)
        self.assertEqual(again[1].code, b"")
        # A code under another record's signature is caught.
        res[0].signature = res[1].signature
        with self.assertRaises(brokerd.SignatureError):
            res[0].decode()

    def test_encode_full_and_ids(self):
        full = self.c.encode_full(["a", "b"], ids=["x", "y"], fidelity="lossless")
        self.assertEqual([r.id for r in full.results], ["x", "y"])
        self.assertIsNone(full.results[0].vector)
        self.assertEqual(full.model, "nbmf-hash-v1")
        self.assertEqual(full.execution.device_id, "cpu:0")

    def test_large_answer(self):
        # 3,000 records with vectors and codes are about 5 MB: one Encode
        # answer would exceed the 4 MiB gRPC clients receive by default.
        texts = [f"record {i} " + "word " * 20 for i in range(3000)]
        res = self.c.encode(texts)
        self.assertEqual(len(res), 3000)
        self.assertEqual(res[2999].text(), texts[2999])

    def test_infer_numpy(self):
        x = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
        out = self.c.infer("mlp", {"input": x})
        self.assertEqual(set(out), {"output"})
        self.assertEqual(out["output"].dtype, np.float32)
        np.testing.assert_allclose(out["output"], mlp_reference(x), rtol=1e-4, atol=1e-5)

    def test_generate(self):
        events = list(self.c.generate("chat", ["one", "two"], max_tokens=5, ignore_eos=True))
        done = [e for e in events if isinstance(e, brokerd.Finished)]
        self.assertEqual(sorted(e.index for e in done), [0, 1])
        for e in done:
            self.assertEqual((e.finish_reason, e.completion_tokens), ("length", 5))
            self.assertGreater(e.prompt_tokens, 0)
        # Seeded sampling gives the same text twice.
        a = brokerd.text(self.c.generate("chat", "seeded", max_tokens=8, temperature=1.0, seed=7, ignore_eos=True))
        b = brokerd.text(self.c.generate("chat", "seeded", max_tokens=8, temperature=1.0, seed=7, ignore_eos=True))
        self.assertEqual(a, b)
        self.assertEqual(len(a), 1)
        # Prompts of token ids: one, or several.
        one = [e for e in self.c.generate("chat", [5, 6, 7], max_tokens=3, ignore_eos=True) if isinstance(e, brokerd.Finished)]
        self.assertEqual([(e.index, e.prompt_tokens, e.completion_tokens) for e in one], [(0, 3, 3)])
        two = [e for e in self.c.generate("chat", [[5, 6], [7]], max_tokens=3, ignore_eos=True) if isinstance(e, brokerd.Finished)]
        self.assertEqual(sorted((e.index, e.prompt_tokens) for e in two), [(0, 2), (1, 1)])

    def test_stats_show_generators(self):
        brokerd.text(self.c.generate("chat", ["one", "two"], max_tokens=5, ignore_eos=True))
        rows = self.c.stats("chat")
        self.assertEqual([(r.model, r.device_id) for r in rows], [("chat@1", ""), ("chat@1", "cpu:0")])
        for r in rows:
            self.assertTrue(r.HasField("generation"), r)
            g = r.generation
            self.assertGreaterEqual(r.completed, 2)
            self.assertGreaterEqual(g.generated_tokens, 10)
            self.assertGreater(g.kv_cache_blocks_total, 0)
            self.assertGreater(g.time_to_first_token.p99_seconds, 0)
            self.assertGreater(g.inter_token_latency.p50_seconds, 0)
            self.assertTrue(r.healthy)
        self.assertGreater(rows[1].max_batch, 0)
        # The model version's name asks for the same rows.
        self.assertEqual([r.model for r in self.c.stats("chat@1")], ["chat@1", "chat@1"])

    def test_chat(self):
        conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color"}]
        events = list(self.c.chat("chat", conv, max_tokens=4, ignore_eos=True))
        done = [e for e in events if isinstance(e, brokerd.Finished)]
        self.assertEqual(len(done), 1)
        # Qwen3's template wraps each turn: well over the words themselves.
        self.assertGreater(done[0].prompt_tokens, 10)
        two = brokerd.text(self.c.chat("chat", [conv, conv[1:]], max_tokens=3, ignore_eos=True))
        self.assertEqual(len(two), 2)

    def test_tokenize(self):
        conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color"}]
        [ids] = self.c.tokenize("chat", messages=conv)
        done = [e for e in self.c.chat("chat", conv, max_tokens=1) if isinstance(e, brokerd.Finished)]
        self.assertEqual(len(ids), done[0].prompt_tokens)
        self.assertIn("Name a color", self.c.detokenize("chat", ids))
        a, b = self.c.tokenize("chat", ["one", "two two"], add_special_tokens=False)
        self.assertEqual(self.c.detokenize("chat", b), "two two")
        self.assertLess(len(a), len(b))
        with self.assertRaises(errors.InvalidArgument):
            self.c.detokenize("chat", [-1])

    def test_structured_output(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                                   "ok": {"type": "boolean"}},
                  "required": ["n", "ok"], "additionalProperties": False}
        events = list(self.c.generate("chat", ["one", "two"], max_tokens=100, temperature=1.0, json_schema=schema))
        texts = brokerd.text(iter(events))
        for t in texts:
            v = json.loads(t)
            self.assertEqual(set(v), {"n", "ok"})
            self.assertIn(v["n"], range(10))
            self.assertIsInstance(v["ok"], bool)
        self.assertTrue(all(e.finish_reason == "stop" for e in events if isinstance(e, brokerd.Finished)))
        digits = brokerd.text(self.c.chat("chat", [{"role": "user", "content": "x"}], max_tokens=20, temperature=1.0,
                                          regex="[0-9]{3}"))
        self.assertRegex(digits[0], r"^[0-9]{3}$")
        obj = brokerd.text(self.c.generate("chat", "x", max_tokens=60, temperature=0.0, grammar='root ::= "{}" | "[]"'))
        self.assertIn(obj[0], ("{}", "[]"))
        with self.assertRaises(errors.InvalidArgument):
            brokerd.text(self.c.generate("chat", "x", max_tokens=4, json_schema={"type": "object", "not": {}}))
        with self.assertRaises(ValueError):
            self.c.generate("chat", "x", regex="a", grammar='root ::= "a"')

    def test_logprobs(self):
        deltas = [e for e in self.c.generate("chat", "name a color", max_tokens=6, ignore_eos=True,
                                             temperature=0.0, logprobs=True, top_logprobs=3)
                  if isinstance(e, brokerd.Delta)]
        ids = [t for d in deltas for t in d.token_ids]
        entries = [lp for d in deltas for lp in d.logprobs]
        self.assertEqual(len(ids), 6)
        self.assertEqual([lp.chosen.token_id for lp in entries], ids)
        for lp in entries:
            self.assertIsInstance(lp, brokerd.Logprob)
            self.assertEqual(len(lp.top), 3)
            self.assertLessEqual(lp.chosen.logprob, 0)
            for t in [lp.chosen] + lp.top:
                self.assertTrue(t.text, t)  # every token, alternatives too, has its text
                self.assertTrue(t.bytes, t)
            # Greedy: the chosen token is the likeliest.
            self.assertEqual(lp.top[0].token_id, lp.chosen.token_id)
        # No logprobs unless asked for.
        plain = [e for e in self.c.generate("chat", "x", max_tokens=2, ignore_eos=True) if isinstance(e, brokerd.Delta)]
        self.assertTrue(all(d.logprobs == [] for d in plain))

    def test_logit_bias(self):
        # +100 on one token all but forces it; greedy or drawn.
        ids = [t for e in self.c.generate("chat", "x", max_tokens=3, ignore_eos=True, temperature=1.0,
                                          logit_bias={42: 100})
               if isinstance(e, brokerd.Delta) for t in e.token_ids]
        self.assertEqual(ids, [42, 42, 42])
        with self.assertRaises(errors.InvalidArgument):
            brokerd.text(self.c.generate("chat", "x", max_tokens=1, logit_bias={42: 101}))

    def test_enable_thinking_reaches_the_template(self):
        # Qwen3's template writes an empty think block into the prompt when
        # thinking is off: <think>, "\n\n", </think>, "\n\n" are 4 tokens.
        conv = [{"role": "user", "content": "Name a color"}]

        def prompt_tokens(**kw):
            done = [e for e in self.c.chat("chat", conv, max_tokens=1, **kw) if isinstance(e, brokerd.Finished)]
            return done[0].prompt_tokens

        default = prompt_tokens()
        self.assertEqual(prompt_tokens(enable_thinking=False), default + 4)
        self.assertEqual(prompt_tokens(chat_template_kwargs={"enable_thinking": False}), default + 4)
        self.assertEqual(prompt_tokens(enable_thinking=True), default)

    def test_tools_reach_the_template(self):
        # The tools and a tool round trip are rendered into the prompt.
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
        conv = [{"role": "user", "content": "Weather in Paris?"}]
        call = brokerd.ToolCall("call_1", "get_weather", '{"city": "Paris"}')
        history = conv + [{"role": "assistant", "content": None, "tool_calls": [call.message()]},
                          {"role": "tool", "content": "21 degrees", "tool_call_id": call.id}]

        def prompt_tokens(messages, **kw):
            done = [e for e in self.c.chat("chat", messages, max_tokens=1, **kw) if isinstance(e, brokerd.Finished)]
            return done[0].prompt_tokens

        plain = prompt_tokens(conv)
        with_tools = prompt_tokens(conv, tools=tools)
        self.assertGreater(with_tools, plain + 20)
        self.assertEqual(prompt_tokens(conv, tools=tools, tool_choice="none"), with_tools)
        # A call as a dict with arguments a mapping renders the same.
        dict_call = history[:1] + [{"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}] + history[2:]
        self.assertGreater(prompt_tokens(history, tools=tools), with_tools + 10)
        self.assertEqual(prompt_tokens(dict_call, tools=tools), prompt_tokens(history, tools=tools))
        # required and a named function constrain the output, not the prompt.
        self.assertEqual(prompt_tokens(conv, tools=tools, tool_choice="required"), with_tools)
        self.assertEqual(prompt_tokens(conv, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}), with_tools)
        with self.assertRaises(errors.InvalidArgument):
            list(self.c.chat("chat", conv, tools=tools, tool_choice={"type": "function", "function": {"name": "get_time"}}))

    def test_tool_calls_in_deltas(self):
        from brokerd._common import events
        from brokerd._gen.broker.v1 import broker_pb2 as pb
        msg = pb.ChatResponse(deltas=[pb.GenerationDelta(index=0, text="ok", tool_calls=[
            pb.ToolCall(id="call_x", name="f", arguments='{"a": 1}', index=0)])],
            results=[pb.GenerationResult(index=0, finish_reason=pb.FINISH_REASON_TOOL_CALLS)])
        delta, done = events(msg)
        self.assertEqual(delta.text, "ok")
        self.assertEqual(delta.tool_calls, [brokerd.ToolCall("call_x", "f", '{"a": 1}', 0)])
        self.assertEqual(delta.tool_calls[0].args(), {"a": 1})
        self.assertEqual(done.finish_reason, "tool_calls")

    def test_stopping_early_frees_the_sequence(self):
        stream = self.c.generate("chat", "a long answer", max_tokens=3000, ignore_eos=True)
        first = next(stream)
        self.assertIsInstance(first, (brokerd.Delta, brokerd.Finished))
        self.assertEqual(running_sequences(), 1)
        stream.close()
        deadline = time.time() + 15
        while time.time() < deadline:
            running = running_sequences()
            if running == 0:
                break
            time.sleep(0.05)
        self.assertEqual(running, 0, "the abandoned sequence still runs")

    def test_typed_errors(self):
        with self.assertRaises(errors.NotFound) as cm:
            self.c.encode(["x"], model="no-such-model")
        self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertFalse(cm.exception.retryable)
        with self.assertRaises(errors.InvalidArgument):
            self.c.encode([""])
        with self.assertRaises(errors.InvalidArgument):
            self.c.infer("mlp", {"input": np.zeros((2, 5), dtype=np.float32)})
        with self.assertRaises(errors.NotFound):
            list(self.c.generate("no-such-model", "x"))
        with self.assertRaises(TypeError):
            self.c.generate("chat", "x", temprature=0.5)
        with self.assertRaises(TypeError):
            self.c.encode([1.5])

    def test_unreachable(self):
        with brokerd.Client(socket="/nonexistent/brokerd.sock", timeout=5) as c:
            with self.assertRaises(errors.Unavailable) as cm:
                c.devices()
            self.assertTrue(cm.exception.retryable)
            self.assertEqual(brokerd.retry_delay(cm.exception), 0.005)
            self.assertFalse(c.healthy())


if __name__ == "__main__":
    unittest.main()
